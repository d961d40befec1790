"""The offline demo model's calls of any tool a request offers, beyond the tools a registered
phrasebook speaks for (demo/model/engine.py): a tool of a tenant's MCP server, or a team's tool
pack.

Only the tools in the request's `tools` list are ever called: a tool held, or not allowed for the
person the conversation acts for, is not in it, so it is answered in words like an unknown one.

**Written calls.** `[[call TOOL {json}]]` anywhere in the newest message is one call of TOOL with the
JSON object as its input, one per occurrence, in order (`[[call TOOL]]` alone: no arguments). The
input is sent as written, so a person can try the desk's checks of arguments too. A tool that was not
offered, JSON that does not parse or is not an object, or a call not closed with `]]` is answered in
words and not called. A message holding the syntax is read for nothing else.

**Plain words**, read sentence by sentence (a sentence ends at . ! ? ; or a new line; quoted text is
an argument, never a tool's words):

1. A tool is named when every word of its own name appears in the sentence: the part after its last
   "__" (MCP tools are `mcp_<server>__<tool>`), split at "_", "-" and capitals. Two words written
   together count as one ("look up" and "look-up" are "lookup"), a plural as its singular. So
   `mcp_inventory__lookup` is named by "look up", `mcp_notes__add_note` by "add a note".
2. Tools named by the same words: the one naming more words of its own wins, then the one whose other
   words the sentence holds more of (its server's name, its description's words, its arguments'
   names); a tie is answered in words. Several tools named at different places are several calls.
3. A tool's arguments come from its part of the sentence (from its name to the next tool named):
   - any argument: the value written after its name: `sku A-1`, `sku: A-1`, `quantity=5`,
     `text "call back Ada"`;
   - a required string: else a quoted phrase ("..." or '...'), else the word right after the tool's
     name (passing a, an, the, item and the tool's other words) when it holds a digit or a capital
     letter (a code such as A-1, or a name: "look up the contact Ada");
   - a required integer or number: else the next number standing on its own (not the 1 of A-1);
   - a required string with a list of values: else a word of the sentence that is one of them;
   - a boolean, and every optional argument, only after its name.
4. A named tool missing a required argument is not called: the answer says which and how to give it.
5. A sentence that names no tool but holds two or more of a tool's other words is answered with a
   suggestion in words. A guess is never called.

engine.py decides between these and a phrasebook's phrases when both read the same words.

**[[invalid tool input]]**, the demo model's test hook: invalid_call() gives the first required argument
that is not free text (a number, a flag, a choice, a list) of the first tool that has one the word
"not-a-number"; when no tool has one, the first tool with a required argument is called without any.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

CALL_OPENING = re.compile(r"\[\[\s*call\b", re.IGNORECASE)
_CALL_NAME = re.compile(r"\s+([^\s\[\]{}]+)")
_CALL_CLOSING = re.compile(r"\s*\]\]")
_SPACES = re.compile(r"\s*")
# "..." or “...” anywhere; '...' or ‘...’ only when the quote marks stand outside words, so that the
# apostrophe of "customer's" opens nothing
_QUOTED = re.compile(r"[\"“]([^\"“”]+)[\"”]|(?<!\w)['‘]([^'‘’]+)['’](?!\w)")
_SENTENCE_END = re.compile(r"[.!?;]+(?=\s|$)|\n")
_TOKEN = re.compile(r"[A-Za-z0-9]+")
_NAME_PART = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|\d+")
_RAW_WORD = re.compile(r"[^\s,;]+")
_NUMBER = re.compile(r"(?<![\w.-])(-?\d+(?:\.\d+)?)(?![\w-]|\.\d)")
_ASIDE = re.compile(r"\([^)]*\)")  # the desk's own note in an MCP tool's description, e.g. "(A tool of ...)"
_STOP = frozenset(
    """a an the of to in on at by for from with and or but not is are be been its it this that these those as into
    than then so such eg e g how many much what which who when where why can could would should will may might do does
    did have has had me my our your their please i you we they there here up out off any all some each""".split()
)
_BEFORE_VALUE = frozenset("a an the of for on in to about named called item items".split())
_TRUE, _FALSE = frozenset({"true", "yes", "on"}), frozenset({"false", "no", "off"})
_BLOT = "\x00"
SUGGEST_FROM = 2  # a tool's other words a sentence must hold before it is suggested


@dataclass(frozen=True)
class Call:
    """A call to make: where it was asked (`position`, and the `span` of the message it was read from:
    the tool's part of its sentence, or the written call), the tool and its input, the words for
    "I'll ...", and how many of the tool's other words its sentence holds (`context`; 0 for a written
    call)."""

    position: int
    span: tuple[int, int]
    tool: str
    input: dict
    phrase: str
    context: int = 0


@dataclass(frozen=True)
class Note:
    """Words instead of a call: why a tool named was not called (`span` and `context` as a Call's), or
    a suggestion (`guess`) for a sentence that named none (`span`: the sentence)."""

    position: int
    span: tuple[int, int]
    text: str
    context: int = 0
    guess: bool = False


def has_call_syntax(text: str) -> bool:
    return CALL_OPENING.search(text) is not None


# --- [[call TOOL {json}]] --------------------------------------------------------------------------


def written_calls(text: str, tools: list[dict]) -> tuple[list[Call], list[Note]]:
    """Every `[[call TOOL {json}]]` of the text: a Call for each one that can be made, a Note saying
    why for each one that cannot."""
    offered = {tool.get("name"): tool for tool in tools}
    calls: list[Call] = []
    notes: list[Note] = []
    for opening in CALL_OPENING.finditer(text):
        at = opening.start()
        named = _CALL_NAME.match(text, opening.end())
        if named is None:
            notes.append(Note(at, (at, opening.end()), f"A [[call]] needs a tool's name: {_syntax_example(tools)}"))
            continue
        name = named.group(1)
        span = (at, named.end())
        if name not in offered:
            notes.append(Note(at, span, f"I can't call {name}: it isn't one of the tools offered to me here."))
            continue
        arguments, end, problem = _written_arguments(text, named.end())
        if problem:
            notes.append(Note(at, span, f"I didn't call {name}: {problem} For example: {_example_call(offered[name])}"))
            continue
        calls.append(Call(at, (at, end), name, arguments, f"call {name}"))
    return calls, notes


def _written_arguments(text: str, at: int) -> tuple[dict, int, str]:
    """The JSON object written at `at` (none: no arguments) and where the call ends; or what is wrong."""
    start = _SPACES.match(text, at).end()
    arguments: Any = {}
    end = start
    if not text.startswith("]]", start):
        try:
            arguments, end = json.JSONDecoder().raw_decode(text, start)
        except ValueError as exc:
            where = getattr(exc, "pos", start) - start + 1
            reason = getattr(exc, "msg", str(exc))
            return {}, start, f"its arguments are not valid JSON ({reason} at character {where})."
        if not isinstance(arguments, dict):
            return {}, start, "its arguments must be one JSON object, in braces."
    closing = _CALL_CLOSING.match(text, end)
    if closing is None:
        return {}, start, "the call is not closed with ]] right after its arguments."
    return arguments, closing.end(), ""


# --- plain words -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Token:
    word: str  # lower case, singular
    start: int
    end: int


@dataclass(frozen=True)
class _Named:
    tool: dict
    position: int  # where its first name word stands
    name_end: int  # where its last name word ends
    own_words: int
    context: int


def worded_calls(text: str, tools: list[dict]) -> tuple[list[Call], list[Note]]:
    """The calls the text asks for in plain words, by the rules of the module's docstring, and the
    notes for what it named but cannot call (or seems to mean)."""
    quotes = [(m.start(), m.end(), m.group(1) or m.group(2)) for m in _QUOTED.finditer(text)]
    masked = _masked(text, quotes)
    calls: list[Call] = []
    notes: list[Note] = []
    for start, end in _sentences(masked):
        tokens = _tokens(masked, start, end)
        present = {token.word for token in tokens}
        named = [found for tool in tools if (found := _named(tool, tokens, present))]
        if not named:
            guess = _suggestion(tools, present)
            if guess:
                notes.append(Note(start, (start, end), guess, guess=True))
            continue
        chosen: list[_Named] = []
        for position in sorted({found.position for found in named}):
            rivals = sorted(
                (found for found in named if found.position == position),
                key=lambda found: (found.own_words, found.context),
                reverse=True,
            )
            top = rivals[0]
            tied = [r for r in rivals if (r.own_words, r.context) == (top.own_words, top.context)]
            if len(tied) > 1:
                names = [r.tool["name"] for r in tied]
                notes.append(
                    Note(
                        position,
                        (start, end),
                        f"Your words name more than one tool ({_join(names)}); say which by its full name, for "
                        f"example {_example_call(tied[0].tool)}",
                        top.context,
                    )
                )
                continue
            chosen.append(top)
        for i, found in enumerate(chosen):
            part = (found.position, chosen[i + 1].position if i + 1 < len(chosen) else end)
            arguments, missing = _arguments(found, text, masked, quotes, *part)
            name = found.tool["name"]
            if missing:
                notes.append(Note(found.position, part, _missing_note(found.tool, missing), found.context))
                continue
            calls.append(Call(found.position, part, name, arguments, _phrase(name, arguments), found.context))
    return calls, notes


def _masked(text: str, quotes: list[tuple[int, int, str]]) -> str:
    """The text with every quoted phrase blotted out (same length, so positions still hold). The blot
    is neither a word nor a space, so a value written after an argument's name still starts where
    its quote does."""
    chars = list(text)
    for start, end, _ in quotes:
        chars[start:end] = _BLOT * (end - start)
    return "".join(chars)


def _sentences(masked: str) -> list[tuple[int, int]]:
    spans, start = [], 0
    for end in _SENTENCE_END.finditer(masked):
        spans.append((start, end.start()))
        start = end.end()
    spans.append((start, len(masked)))
    return [(s, e) for s, e in spans if masked[s:e].strip()]


def _normal(word: str) -> str:
    word = word.lower()
    return word[:-1] if len(word) > 3 and word.endswith("s") and not word.endswith("ss") else word


def _tokens(masked: str, start: int, end: int) -> list[_Token]:
    """The sentence's words, and every two neighbours written together ("look up" is also "lookup")."""
    raw = [m for m in _TOKEN.finditer(masked, start, end)]
    tokens = [_Token(_normal(m.group()), m.start(), m.end()) for m in raw]
    for first, second in zip(raw, raw[1:], strict=False):
        if masked[first.end() : second.start()].strip(" -") == "":
            tokens.append(_Token(_normal(first.group() + second.group()), first.start(), second.end()))
    return tokens


def _name_words(part: str) -> list[str]:
    return [_normal(word) for piece in re.split(r"[_\-\s]+", part) for word in _NAME_PART.findall(piece)]


def _own_words(tool: dict) -> list[str]:
    return _name_words(tool.get("name", "").rsplit("__", 1)[-1])


def _other_words(tool: dict) -> set[str]:
    """The tool's words besides its own name: its namespace (an MCP server's name), its description's
    words (without the desk's note in parentheses) and its arguments' names."""
    name = tool.get("name", "")
    namespace = _name_words(name.rsplit("__", 1)[0]) if "__" in name else []
    described = [_normal(w) for w in _TOKEN.findall(_ASIDE.sub(" ", str(tool.get("description") or "")))]
    arguments = [w for prop in _properties(tool) for w in _name_words(prop)]
    own = _own_words(tool)
    words = {w for w in [*namespace, *described, *arguments] if w not in _STOP and len(w) > 2 and w != "mcp"}
    # A part of a name word counts with the name, not again beside it ("look" of "lookup").
    return {w for w in words if not any(w in name_word for name_word in own)}


def _named(tool: dict, tokens: list[_Token], present: set[str]) -> _Named | None:
    own = _own_words(tool)
    if not own or not all(word in present for word in own):
        return None
    firsts = [min((t for t in tokens if t.word == word), key=lambda t: t.start) for word in own]
    return _Named(
        tool,
        position=min(t.start for t in firsts),
        name_end=max(t.end for t in firsts),
        own_words=len(set(own)),
        context=len(_other_words(tool) & present),
    )


def _suggestion(tools: list[dict], present: set[str]) -> str | None:
    scored = [(len(_other_words(tool) & present), tool) for tool in tools]
    best = max((score for score, _ in scored), default=0)
    if best < SUGGEST_FROM:
        return None
    fitting = [tool for score, tool in scored if score == best][:3]
    described = "; ".join(f"{tool['name']} ({_first_sentence(tool)})" for tool in fitting)
    example = fitting[0]
    these = "This might fit" if len(fitting) == 1 else "These might fit"
    return (
        f"I'm not sure which tool you mean. {these}: {described}. To use one, name it in your words "
        f'("{" ".join(_own_words(example))} ..." with its arguments) or write {_example_call(example)}'
    )


def _arguments(
    found: _Named, text: str, masked: str, quotes: list[tuple[int, int, str]], start: int, end: int
) -> tuple[dict, list[str]]:
    """The tool's arguments from its part of the sentence, and the required ones not found."""
    properties = _properties(found.tool)
    required = [name for name in found.tool.get("input_schema", {}).get("required") or [] if name in properties]
    values: dict[str, Any] = {}
    taken: list[tuple[int, int]] = []

    for name, schema in properties.items():  # 1. written after its name
        pattern = r"[\s_-]?".join(map(re.escape, _name_words(name)))
        after = re.compile(r"(?<![\w-])" + pattern + r"(?:\s*[:=]\s*|\s+(?:is\s+|of\s+|to\s+)?)", re.IGNORECASE)
        for match in after.finditer(masked, start, end):
            quote = next((q for q in quotes if q[0] == match.end()), None)
            word = None if quote else _RAW_WORD.match(text, match.end(), end)
            raw = quote[2] if quote else (word.group().rstrip(".!?)") if word else "")
            value = _typed(raw, schema, quoted=quote is not None)
            if value is not None:
                values[name] = value
                taken.append((match.start(), quote[1] if quote else word.end()))
                break

    def free(span_start: int, span_end: int) -> bool:
        return all(span_end <= s or span_start >= e for s, e in taken)

    wanted = [name for name in required if name not in values]
    for name in wanted:  # 2. a word that is one of its values
        choices = properties[name].get("enum")
        if isinstance(choices, list):
            by_word = {str(choice).lower(): choice for choice in choices}
            hit = next((t for t in _TOKEN.finditer(masked, start, end) if t.group().lower() in by_word), None)
            if hit:
                values[name] = by_word[hit.group().lower()]
                taken.append((hit.start(), hit.end()))

    for name in [n for n in wanted if n not in values and _kind(properties[n]) == "string"]:  # 3. quoted
        quote = next((q for q in quotes if start <= q[0] < end and free(q[0], q[1])), None)
        if quote:
            values[name] = quote[2]
            taken.append((quote[0], quote[1]))

    for name in [n for n in wanted if n not in values and _kind(properties[n]) in ("integer", "number")]:
        for number in _NUMBER.finditer(masked, start, end):  # 4. a number standing on its own
            value = _typed(number.group(1), properties[name])
            if value is not None and free(number.start(), number.end()):
                values[name] = value
                taken.append((number.start(), number.end()))
                break

    strings = [n for n in wanted if n not in values and _kind(properties[n]) == "string"]
    if strings:  # 5. the word right after the tool's name, when it looks like a code or a name
        passed = _BEFORE_VALUE | _other_words(found.tool)  # "look up the contact Ada"
        for word in _RAW_WORD.finditer(masked, found.name_end, end):
            cleaned = word.group().strip(".!?()[]")
            if cleaned.lower() in passed or _normal(cleaned) in passed:
                continue
            if cleaned and free(word.start(), word.end()) and re.search(r"[0-9A-Z]", cleaned):
                values[strings[0]] = cleaned
            break
    in_order = {name: values[name] for name in properties if name in values}  # as the schema lists them
    return in_order, [name for name in required if name not in values]


def _properties(tool: dict) -> dict[str, dict]:
    properties = (tool.get("input_schema") or {}).get("properties") or {}
    return {name: schema if isinstance(schema, dict) else {} for name, schema in properties.items()}


def _kind(schema: dict) -> str:
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in ("string", "integer", "number", "boolean") if k in kind), None)
    return kind if isinstance(kind, str) else "string" if "enum" not in schema else "enum"


def _typed(raw: str, schema: dict, quoted: bool = False) -> Any:
    """The written value as the schema's type; None when it is not one."""
    kind = _kind(schema)
    if not raw:
        return None
    if kind == "integer" and not quoted and re.fullmatch(r"-?\d+", raw):
        return int(raw)
    if kind == "number" and not quoted and re.fullmatch(r"-?\d+(?:\.\d+)?", raw):
        return float(raw) if "." in raw else int(raw)
    if kind == "boolean" and not quoted and raw.lower() in _TRUE | _FALSE:
        return raw.lower() in _TRUE
    if kind in ("string", "enum"):
        return raw
    return None


# --- words ----------------------------------------------------------------------------------------


def _phrase(name: str, arguments: dict) -> str:
    if not arguments:
        return f"use {name}"
    return f"use {name} with " + ", ".join(
        f"{key} {json.dumps(value, ensure_ascii=False)}" for key, value in arguments.items()
    )


_EXAMPLE_VALUES = {"string": "...", "integer": 1, "number": 1.5, "boolean": True, "array": [], "object": {}}


def _example_call(tool: dict) -> str:
    required = (tool.get("input_schema") or {}).get("required") or []
    properties = _properties(tool)
    example = {name: _EXAMPLE_VALUES.get(_kind(properties.get(name, {})), "...") for name in required}
    return f"[[call {tool['name']} {json.dumps(example)}]]"


def _syntax_example(tools: list[dict]) -> str:
    return f"write it as {_example_call(tools[0])}" if tools else "no tools are offered to me here, though."


def _missing_note(tool: dict, missing: list[str]) -> str:
    properties = _properties(tool)
    what = {
        "integer": "a whole number",
        "number": "a number",
        "boolean": "true or false",
        "array": "a list",
        "object": "an object",
    }
    needed = [f"{name} ({what.get(_kind(properties[name]), 'text')})" for name in missing]
    shown = {"integer": "5", "number": "1.5", "boolean": "true", "string": '"..."', "enum": '"..."'}
    examples = [f"{name} {shown[_kind(properties[name])]}" for name in missing if _kind(properties[name]) in shown]
    how = f"Write it after its name (for example: {', '.join(examples)}), or write " if examples else "Write "
    return f"I can't use {tool['name']} yet: I need its {_join(needed)}. {how}{_example_call(tool)}"


def invalid_call(tools: list[dict]) -> Call | None:
    """A call its tool's schema refuses, for the [[invalid tool input]] hook (the module's docstring
    says which); None when no tool requires an argument."""
    requiring = [tool for tool in tools if (tool.get("input_schema") or {}).get("required")]
    for tool in requiring:
        properties = _properties(tool)
        for name in tool["input_schema"]["required"]:
            if _kind(properties.get(name, {})) != "string":
                arguments = {name: "not-a-number"}
                return Call(0, (0, 0), tool["name"], arguments, _phrase(tool["name"], arguments))
    if not requiring:
        return None
    return Call(0, (0, 0), requiring[0]["name"], {}, _phrase(requiring[0]["name"], {}))


def offer_sentence(tools: list[dict]) -> str:
    """A sentence for the help answer naming the tools reached by words or [[call ...]]; empty when none."""
    if not tools:
        return ""
    names = [tool["name"] for tool in tools]
    return (
        f"I can also use {_join(names)}: name one in your words (for example "
        f'"{" ".join(_own_words(tools[0]))} ..." with its arguments) or write {_example_call(tools[0])}.'
    )


def describe_result(name: str, data: Any) -> str:
    """One sentence for a tool's successful result that the demo has no words of its own for."""
    if isinstance(data, dict) and set(data) == {"result"}:  # how MCP servers wrap a plain value
        data = data["result"]
    if isinstance(data, dict):
        return f"{name} answered: {_facts(data, 8)}." if data else f"{name} answered with nothing."
    if isinstance(data, list):
        if not data:
            return f"{name} answered with an empty list."
        shown = "; ".join(_facts(item, 3) if isinstance(item, dict) else _value(item) for item in data[:5])
        more = f" and {len(data) - 5} more" if len(data) > 5 else ""
        return f"{name} answered with {len(data)} item{'s' if len(data) != 1 else ''}: {shown}{more}."
    text = _brief(str(data))
    return f"{name} answered: {text}" if text else f"{name} answered with nothing."


def _facts(record: dict, limit: int) -> str:
    facts = [f"{str(key).replace('_', ' ')} {_value(value)}" for key, value in list(record.items())[:limit]]
    return _brief(", ".join(facts))


def _value(value: Any) -> str:
    if isinstance(value, str | int | float | bool) or value is None:
        return str(value)
    return json.dumps(value, ensure_ascii=False)


def _first_sentence(tool: dict) -> str:
    description = re.sub(r"\s+([,.;:])", r"\1", _ASIDE.sub("", str(tool.get("description") or ""))).strip()
    first = re.split(r"(?<=[.!?])\s+(?=[A-Z])", description, maxsplit=1)[0].rstrip(".")
    return _brief(first, 120) or "no description"


def _brief(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _join(phrases: list[str]) -> str:
    return phrases[0] if len(phrases) == 1 else ", ".join(phrases[:-1]) + " and " + phrases[-1]
