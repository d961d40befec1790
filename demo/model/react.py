"""The offline demo model speaking the text protocol (webapp/llm/react.py), so that
MODEL_PROTOCOL=react works offline too: the request's text is read back into tools, tool calls and
tool results, the demo model answers that, and its answer goes back as one JSON object in words
(one action per reply, so a request for several actions is carried out one at a time: after each
result, the next call the request asked for that no action has made yet)."""

from __future__ import annotations

import json

from webapp.llm.react import MARKER, TOOLS_HEADING, read_action


def is_react_request(body: dict) -> bool:
    system = body.get("system")
    return not body.get("tools") and isinstance(system, list) and any(MARKER in b.get("text", "") for b in system)


def respond(body: dict, responder) -> dict:
    """The demo model's answer to a text-protocol request, in the protocol's words."""
    native = {**body, "tools": _tools(body["system"]), "messages": _native(body["messages"])}
    answer = responder(native)
    uses = [block for block in answer["content"] if block["type"] == "tool_use"]
    words = " ".join(block["text"] for block in answer["content"] if block["type"] == "text").strip()
    if not uses:
        uses = _still_to_do(native, responder)
    if uses:
        reply = {
            "thought": words or "I need a tool for this.",
            "action": uses[0]["name"],
            "action_input": uses[0]["input"],
        }
        text = "```json\n" + json.dumps(reply) + "\n```"
    else:
        text = json.dumps({"thought": "I can answer this.", "final_answer": words})
    return {**answer, "content": [{"type": "text", "text": text}], "stop_reason": "end_turn"}


def _still_to_do(native: dict, responder) -> list[dict]:
    """The calls the person's request asked for that no action has made yet, in order: the protocol
    takes one action per reply, so the rest of a request for several come one after another."""
    messages = native["messages"]
    asked_at = next(
        (
            i
            for i in range(len(messages) - 1, -1, -1)
            if messages[i]["role"] == "user" and any(b["type"] == "text" for b in messages[i]["content"])
        ),
        None,
    )
    if asked_at is None or asked_at == len(messages) - 1:
        return []
    request = [b for b in messages[asked_at]["content"] if b["type"] == "text"][-1:]
    first = responder({**native, "messages": [{"role": "user", "content": request}]})
    made = [
        _call_key(block)
        for message in messages[asked_at + 1 :]
        for block in message["content"]
        if block["type"] == "tool_use"
    ]
    still = []
    for block in first["content"]:
        if block["type"] != "tool_use":
            continue
        if _call_key(block) in made:
            made.remove(_call_key(block))
        else:
            still.append(block)
    return still


def _call_key(block: dict) -> str:
    return json.dumps([block["name"], block["input"]], sort_keys=True)


def _tools(system: list[dict]) -> list[dict]:
    text = next(b["text"] for b in system if MARKER in b.get("text", ""))
    listed = text.split(TOOLS_HEADING, 1)[1] if TOOLS_HEADING in text else ""
    return [json.loads(line) for line in listed.splitlines() if line.startswith("{")]


def _native(messages: list[dict]) -> list[dict]:
    """The desk's text rendering read back: JSON actions become tool_use blocks, observations
    tool_result blocks (answering the open actions in order)."""
    native, open_ids, count = [], [], 0
    for message in messages:
        blocks = []
        for part in message["content"][0]["text"].split("\n\n"):
            if message["role"] == "assistant":
                action, _ = read_action(part)
                if action is not None and "action" in action:
                    count += 1
                    open_ids.append(f"toolu_demo_{count}")
                    blocks.append(
                        {
                            "type": "tool_use",
                            "id": open_ids[-1],
                            "name": action["action"],
                            "input": action["action_input"],
                        }
                    )
                    continue
            elif part.startswith("Observation from ") and open_ids:
                name_and_flag, _, result = part.removeprefix("Observation from ").partition(": ")
                block = {"type": "tool_result", "tool_use_id": open_ids.pop(0), "content": result}
                if name_and_flag.endswith(" (failed)"):
                    block["is_error"] = True
                blocks.append(block)
                continue
            blocks.append({"type": "text", "text": part})
        native.append({"role": message["role"], "content": blocks})
    return native
