"""The offline demo model: a deterministic stand-in for Claude beneath the real SDK.

respond(request) turns a Messages API request body into a complete Messages API response body. It
reads the last user message: tool results are answered in plain words (one line per result); a
request in words becomes tool_use blocks, one per action asked for, for the tools the request offers.
Same request, same response, down to the ids. Test hooks in the user's text force the awkward cases:
[[long answer]] (some 2,000 words), [[max tokens]] (cut off at the limit), [[refusal]], [[invalid tool
input]] (an offered tool called with input its schema refuses: other_tools.invalid_call says which) and
[[unknown tool]] (a call of NO_SUCH_TOOL, which is never offered). They need no phrasebook.

The engine names no tool. What it knows of a domain comes from the phrasebooks that packs register
(register_phrasebook; the billing pack's is demo/billing/phrases.py): the tools a book speaks for,
its reading of a person's words into calls, its words for those tools' results, the next step of a
plan once results are in, and its lines of the help answer. Every other tool the request offers (an
MCP server's, a team's pack without a phrasebook) is called with `[[call TOOL {json}]]` or by the
words of its name (demo/model/other_tools.py). When a sentence names such a tool and a phrasebook
reads something in it too, the named tool wins if the sentence also holds another of its words (its
server's name, a word of its description or an argument's name: "look up A-1 in the inventory");
otherwise the phrasebook wins ("look up Alice Moore").
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from demo.model import other_tools
from webapp.tools import presenting
from webapp.tools.registry import unwrap_output

NO_SUCH_TOOL = "no_such_tool"  # what [[unknown tool]] calls: a name of the engine's own, never offered


# --- phrasebooks: what a pack teaches the demo model ----------------------------------------------


@dataclass(frozen=True)
class Call:
    """A call a phrasebook reads in a person's words: where it was asked (`position`, an index into
    the text), the tool and its input, and the words that complete "I'll ..." ("refund $20.00 on
    invoice 4471")."""

    position: int
    tool: str
    input: dict
    phrase: str


@dataclass(frozen=True)
class Note:
    """Words instead of a call, at `position` in the text: a question back ("Which invoice should I
    refund?") or why nothing can be done."""

    position: int
    text: str


@dataclass(frozen=True)
class Result:
    """One answered call of the round, as a phrasebook reads it: the tool, the input it ran with (a
    person's edit applied), its data (JSON read from inside the desk's fence, else the text) and
    whether it failed (rejected, expired, cancelled, invalid, crashed)."""

    tool: str
    input: dict
    data: Any
    is_error: bool


@dataclass(frozen=True)
class FollowUp:
    """The next step of a plan once a round's results are in: words said after the summary of the
    results, and the calls to make now (none: the words end the turn)."""

    text: str
    calls: tuple[Call, ...] = ()


class Phrasebook:
    """What a pack teaches the offline demo model about its own tools. Subclass it, set `name` and
    `tools`, override what the pack needs, and register one instance when the pack is imported:

        register_phrasebook(BillingPhrases())

    - `name`: one word for the pack's domain, said in the help answer ("I'm the offline demo billing
      assistant.") and the key of the registration: registering a name again replaces the book.
    - `tools`: the tool names it speaks for. The engine reaches every other offered tool through
      other_tools; a call the book reads for one of its tools that the request does not offer becomes
      "I can't <phrase> here: the <tool> tool isn't available."
    - `read(text)`: the calls and notes the person's words ask for, each at its position in the text,
      whether or not the tools are offered. A part of a sentence that names another tool goes to that
      tool instead, as the module's docstring says.
    - `describe(result)`: one sentence for a successful result of one of its tools; None leaves it to
      the engine's generic sentence ("<tool> answered: ..."). Failures are told by the engine.
    - `follow_up(request, results, offered)`: after a round of results, the next step the person's
      request (`request`: their words those results serve) still needs, e.g. the refund once the
      invoices are looked up; None when there is none. `offered`: the tool names the request offers
      (a call of any other tool is dropped). Each book's words follow the summary of the results.
    - `help(offered)`: its sentences of the help answer, for the tools offered; "" when it has none.

    One book serves every thread of the process at once: keep no state between calls.
    """

    name: str = ""
    tools: frozenset[str] = frozenset()

    def read(self, text: str) -> tuple[list[Call], list[Note]]:
        return [], []

    def describe(self, result: Result) -> str | None:
        return None

    def follow_up(self, request: str, results: list[Result], offered: frozenset[str]) -> FollowUp | None:
        return None

    def help(self, offered: frozenset[str]) -> str:
        return ""


_phrasebooks: tuple[Phrasebook, ...] = ()
_registering = threading.Lock()


def register_phrasebook(book: Phrasebook) -> None:
    """Make the demo model speak `book`'s phrases in this process, from its next answer on. Safe from
    any thread, and idempotent: a book of a name already registered takes its place (a module imported
    twice registers once). A book that speaks for a tool another book already speaks for is refused
    (ValueError), since two books would read the same words into different calls."""
    global _phrasebooks
    if not book.name:
        raise ValueError("a phrasebook needs a name")
    with _registering:
        others = [known for known in _phrasebooks if known.name != book.name]
        for other in others:
            shared = sorted(book.tools & other.tools)
            if shared:
                raise ValueError(
                    f"the phrasebook {book.name!r} speaks for {', '.join(shared)}, which the phrasebook "
                    f"{other.name!r} already speaks for"
                )
        names = [known.name for known in _phrasebooks]
        books = list(_phrasebooks)
        if book.name in names:
            books[names.index(book.name)] = book
        else:
            books.append(book)
        _phrasebooks = tuple(books)


def registered_phrasebooks() -> tuple[Phrasebook, ...]:
    """The phrasebooks registered in this process, in the order they were first registered."""
    return _phrasebooks


def respond(request: dict, phrasebooks: Iterable[Phrasebook] | None = None) -> dict:
    """The demo model's complete Messages API response (a dict) to a request body, speaking the
    registered phrasebooks (or `phrasebooks`, when given: a test's own, or none)."""
    books = registered_phrasebooks() if phrasebooks is None else tuple(phrasebooks)
    messages = request.get("messages") or []
    offered = [tool for tool in request.get("tools") or [] if isinstance(tool, dict) and tool.get("name")]
    if (request.get("tool_choice") or {}).get("type") == "none":
        offered = []
    tools = frozenset(tool["name"] for tool in offered)
    user_index = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=None)
    if user_index is None:
        content, stop = [_text(_help(offered, books))], "end_turn"
    elif _tool_results(messages[user_index]) and not _newest_text(messages[user_index]):
        content, stop = _answer_results(messages, user_index, tools, books)
    else:  # a new question, possibly sent after a stopped round: answer the newest words
        content, stop = _answer_text(_newest_text(messages[user_index]), offered, books)
    content = [_with_id(block, i, messages) for i, block in enumerate(content)]
    return {
        "id": "msg_demo_" + _digest({**request, "stream": None}),
        "type": "message",
        "role": "assistant",
        "model": request.get("model", "demo"),
        "content": content,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": _usage(request, content, stop),
    }


def _spoken(books: tuple[Phrasebook, ...]) -> frozenset[str]:
    """The tools some phrasebook speaks for: other_tools answers only the others."""
    return frozenset().union(*(book.tools for book in books))


# --- a request in words ---------------------------------------------------------------------------


def _answer_text(text: str, offered: list[dict], books: tuple[Phrasebook, ...]) -> tuple[list[dict], str]:
    tools = {tool["name"] for tool in offered}
    lowered = text.lower()
    if "[[invalid tool input]]" in lowered:
        invalid = other_tools.invalid_call(offered)
        if invalid is None:
            return [_text("No tool offered to me here needs an argument, so I have no input to get wrong.")], "end_turn"
        return _turn([invalid], [], offered, books)
    if "[[unknown tool]]" in lowered:
        return [_text(f"I'll use {NO_SUCH_TOOL}."), _tool_use(NO_SUCH_TOOL, {})], "tool_use"
    if "[[long answer]]" in lowered:
        return [_text(_long_answer())], "end_turn"
    if "[[max tokens]]" in lowered:
        return [
            _text("Here is a very thorough answer that keeps going past the token limit, so it stops")
        ], "max_tokens"
    if "[[refusal]]" in lowered:
        return [_text("I can't help with that request.")], "refusal"

    if other_tools.has_call_syntax(text):  # written calls: nothing else in the message is a request
        written, refused = other_tools.written_calls(text, offered)
        return _turn(written, [note.text for note in refused], offered, books)

    readings = [book.read(text) for book in books]
    planned = sorted((call for calls, _ in readings for call in calls), key=lambda call: call.position)
    planned_notes = [note for _, notes in readings for note in notes]
    spoken = _spoken(books)
    others = [tool for tool in offered if tool["name"] not in spoken]
    worded, worded_notes = other_tools.worded_calls(text, others)
    phrased = [*(call for call in planned if call.tool in tools), *planned_notes]  # an unoffered tool's claims nothing

    def phrased_in(span: tuple[int, int]) -> bool:
        return any(span[0] <= item.position < span[1] for item in phrased)

    # The part of a sentence that names another tool is that tool's, unless a phrasebook reads it too and
    # the sentence holds none of the tool's other words (then "look up Alice" stays the phrasebook's). A
    # mere suggestion never takes words a phrasebook reads.
    worded = [call for call in worded if call.context > 0 or not phrased_in(call.span)]
    worded_notes = [note for note in worded_notes if (note.context > 0 and not note.guess) or not phrased_in(note.span)]
    claimed = [item.span for item in [*worded, *worded_notes] if not getattr(item, "guess", False)]

    def unclaimed(item: Any) -> bool:
        return not any(start <= item.position < end for start, end in claimed)

    calls = [call for call in planned if call.tool in tools and unclaimed(call)]
    notes = [*(note for note in planned_notes if unclaimed(note)), *worded_notes]
    said = [note.text for note in sorted(notes, key=lambda n: n.position)]
    said += [
        f"I can't {call.phrase} here: the {call.tool} tool isn't available."
        for call in planned
        if call.tool not in tools and unclaimed(call)
    ]
    return _turn(sorted([*calls, *worded], key=lambda call: call.position), said, offered, books)


def _turn(calls: list, notes: list[str], offered: list[dict], books: tuple[Phrasebook, ...]) -> tuple[list[dict], str]:
    """The reply: "I'll ..." and a tool_use block per call, the notes after; only words without calls."""
    if not calls:
        return [_text(" ".join(notes) if notes else _help(offered, books))], "end_turn"
    intro = "I'll " + presenting.people([call.phrase for call in calls]) + "."
    return [_text(" ".join([intro, *notes])), *(_tool_use(c.tool, c.input) for c in calls)], "tool_use"


# --- tool results ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Answered:
    """A result of the round: as phrasebooks read it, its text without the desk's note of an edit,
    and that edit (who, what was asked, what ran) when a person made one."""

    result: Result
    text: str
    edit: dict | None


def _answer_results(
    messages: list[dict], user_index: int, tools: frozenset[str], books: tuple[Phrasebook, ...]
) -> tuple[list[dict], str]:
    previous = messages[user_index - 1] if user_index > 0 else {}
    uses = {b.get("id"): b for b in _blocks(previous) if b.get("type") == "tool_use"}
    results = _tool_results(messages[user_index])
    answered = [_answered(uses.get(result.get("tool_use_id"), {}), result) for result in results]
    lines = [_describe_result(one, books) for one in answered]
    summary = lines[0] if len(lines) == 1 else "Here's what happened:\n" + "\n".join(f"- {line}" for line in lines)

    original = _original_request(messages, user_index)
    finished = [one.result for one in answered]
    steps = [step for book in books if original and (step := book.follow_up(original, finished, tools))]
    calls = [call for step in steps for call in step.calls if call.tool in tools]
    if not steps:
        return [_text(summary)], "end_turn"
    text = summary + "".join(f"\n\n{step.text}" for step in steps)
    return [_text(text), *(_tool_use(call.tool, call.input) for call in calls)], "tool_use" if calls else "end_turn"


def _answered(use: dict, result: dict) -> _Answered:
    text = _result_text(result)
    call_input = use.get("input") or {}
    edit = _edit_note(text)
    if edit:  # a person changed the arguments: what ran is what to describe, and the change is news
        call_input = edit["ran"]
        text = text.split("\n", 1)[1] if "\n" in text else ""
    data = _result_data(result)
    return _Answered(Result(use.get("name", "the tool"), call_input, data, bool(result.get("is_error"))), text, edit)


def _describe_result(answered: _Answered, books: tuple[Phrasebook, ...]) -> str:
    result = answered.result
    if result.is_error:
        return _describe_error(result.tool, answered.text)
    book = next((book for book in books if result.tool in book.tools), None)
    described = (book.describe(result) if book else None) or other_tools.describe_result(result.tool, result.data)
    return described + (_describe_edit(answered.edit) if answered.edit else "")


_EDIT_NOTE = re.compile(
    r"^Note from the approval desk: a person \((?P<who>.*?)\) changed the arguments before approving\. "
    r"You asked for (?P<asked>\{.*\}); the tool ran with (?P<ran>\{.*\})\.$"
)


def _edit_note(text: str) -> dict | None:
    """The desk's note that a person edited the call: who, what was asked, what ran."""
    match = _EDIT_NOTE.match(text.split("\n", 1)[0])
    if not match:
        return None
    try:
        return {"who": match["who"], "asked": json.loads(match["asked"]), "ran": json.loads(match["ran"])}
    except ValueError:
        return None


def _describe_edit(edit: dict) -> str:
    """What a person changed, argument by argument, by the tools' own conventions for their names
    (webapp/tools/presenting.py: an amount in cents is told in dollars)."""
    asked, ran = edit["asked"], edit["ran"]
    changed = [
        f"{presenting.label(key).lower()} from {_shown(key, asked.get(key))} to {_shown(key, ran.get(key))}"
        for key in sorted({*asked, *ran})
        if asked.get(key) != ran.get(key)
    ]
    who = edit["who"].split(" (")[0]
    return f" {who} changed the {presenting.people(changed)} before approving." if changed else ""


def _shown(key: str, value: Any) -> str:
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, int) and not isinstance(value, bool):
        return presenting.value_text(key, value)
    return str(value)


def _describe_error(name: str, text: str) -> str:
    if text.startswith("Declined by a person"):
        return f"A person declined {name} ({_decline_reason(text)}), so I have not done it."
    if text.startswith("No decision was made in time"):
        return f"Nothing was done for {name}, because no decision came in time."
    if text.startswith("Cancelled"):
        detail = _first_sentence(text.split(":", 1)[1]) if ":" in text else ""
        nothing = ", so nothing was done" if "Nothing was done" in text else ""
        return f"{name} was cancelled{f' ({detail})' if detail else ''}{nothing}."
    reason = _first_sentence(unwrap_output(text).strip()) or "no details given"
    return f"{name} failed: {_brief(reason)}"


def _first_sentence(text: str) -> str:
    """The first sentence, without its full stop: what happened, never the advice that follows it."""
    first = re.split(r"(?<=[.!?])\s", text.strip(), maxsplit=1)[0] if text.strip() else ""
    return first.rstrip(".")


def _decline_reason(text: str) -> str:
    """The reviewer's reason in a rejection (what follows "Declined by a person (who): " up to the
    desk's closing words, which are for me, not for the person I answer)."""
    rest = text[len("Declined by a person") :]
    marker = re.search(r"\):\s*|:\s*", rest)
    reason = rest[marker.end() :] if marker else rest
    reason = reason.split(". Nothing was done.")[0]
    reason = reason.strip(" \t\n.,;:-—\"'()")
    return reason or "no reason given"


# --- message helpers ------------------------------------------------------------------------------


def _blocks(message: dict) -> list[dict]:
    content = message.get("content")
    return [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []


def _text_of(message: dict) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    return "\n".join(b.get("text", "") for b in _blocks(message) if b.get("type") == "text")


def _newest_text(message: dict) -> str:
    """The last thing the person wrote in this turn (a turn can hold several texts after a stop)."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    texts = [b.get("text", "") for b in _blocks(message) if b.get("type") == "text" and b.get("text", "").strip()]
    return texts[-1] if texts else ""


def _tool_results(message: dict) -> list[dict]:
    return [b for b in _blocks(message) if b.get("type") == "tool_result"]


def _original_request(messages: list[dict], user_index: int) -> str:
    """The person's words the current tool results serve: the latest user text at or before user_index."""
    for message in reversed(messages[: user_index + 1]):
        if message.get("role") == "user" and _text_of(message).strip():
            return _text_of(message)
    return ""


def _result_text(result: dict) -> str:
    content = result.get("content")
    if isinstance(content, list):
        return "\n".join(b.get("text", "") for b in content if isinstance(b, dict) and b.get("type") == "text")
    return content if isinstance(content, str) else ""


def _result_data(result: dict) -> Any:
    inner = unwrap_output(_result_text(result))
    try:
        return json.loads(inner)
    except ValueError:
        return inner


# --- words ----------------------------------------------------------------------------------------


def _brief(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _help(offered: list[dict], books: tuple[Phrasebook, ...]) -> str:
    """Who I am and what I can do with the tools offered: each phrasebook's sentences, then the other
    tools and how to ask for them."""
    tools = frozenset(tool["name"] for tool in offered)
    spoken = _spoken(books)
    others = other_tools.offer_sentence([tool for tool in offered if tool["name"] not in spoken])
    helped = [(book.name, said) for book in books if (said := book.help(tools))]
    if not helped and not others:
        return "I'm the offline demo assistant. No tools are available to me here, so I can only chat."
    who = f"the offline demo {helped[0][0]} assistant" if len(helped) == 1 else "the offline demo assistant"
    return " ".join([f"I'm {who}.", *(said for _, said in helped), *([others] if others else [])])


def _long_answer() -> str:
    # Six sentences about the desk itself, as long (in characters and words) as the billing ones they
    # replaced, so the context windows of tests and benchmarks fill at the same pace.
    sentences = [
        "Reading tools run at once, and whatever they return reaches the assistant as data, never as orders.",
        "A reviewer approves a call as it stands, edits its arguments first, or declines it.",
        "Every sensitive action waits for a person on the approval desk before it runs.",
        "A call which waits too long expires, and the model is told that nothing was done.",
        "Each model call, tool call and decision is appended to the audit log, never overwritten.",
        "Stopping a run settles its open calls as cancelled, then the conversation resumes.",
    ]
    words: list[str] = []
    paragraph = 0
    while len(words) < 2000:
        paragraph += 1
        text = " ".join(sentences[(paragraph + i) % len(sentences)] for i in range(5))
        words += f"{paragraph}. {text}\n\n".split(" ")
    return " ".join(words).strip()


# --- the response ---------------------------------------------------------------------------------


def _text(text: str) -> dict:
    return {"type": "text", "text": text}


def _tool_use(name: str, tool_input: dict) -> dict:
    return {"type": "tool_use", "id": "", "name": name, "input": tool_input}


def _with_id(block: dict, index: int, messages: list[dict]) -> dict:
    if block["type"] != "tool_use":
        return block
    return {**block, "id": "toolu_" + _digest({"messages": messages, "block": index})}


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:24]


def _usage(request: dict, content: list[dict], stop_reason: str) -> dict:
    """Rough token counts (a token is about four characters), with a cached system+tools prefix."""
    prefix_chars = len(json.dumps(request.get("system") or "")) + len(json.dumps(request.get("tools") or []))
    total_tokens = (prefix_chars + len(json.dumps(request.get("messages") or []))) // 4
    cached = prefix_chars // 4 if "cache_control" in json.dumps(request) else 0
    first_call = len(request.get("messages") or []) <= 1
    output = len(json.dumps(content)) // 4
    if stop_reason == "max_tokens":
        output = request.get("max_tokens", output)
    return {
        "input_tokens": max(1, total_tokens - cached),
        "output_tokens": max(1, output),
        "cache_creation_input_tokens": cached if first_call else 0,
        "cache_read_input_tokens": 0 if first_call else cached,
    }
