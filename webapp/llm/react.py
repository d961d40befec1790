"""The text protocol for models without native tool use (MODEL_PROTOCOL=react).

Local models behind an Anthropic-compatible server (Ollama, llama.cpp's server) often cannot use
tools natively. For them the request carries no `tools`: the tools are described in the system
prompt, and the model answers with one JSON object, an action or a final answer:

    {"thought": "...", "action": "mcp_inventory__lookup", "action_input": {"sku": "A-1"}}
    {"thought": "...", "final_answer": "There are 12 blue mugs (A-1) in stock."}

ReactClient speaks that protocol under the same interface as ModelClient, so the loop does not
change: the history's tool_use blocks go out as the model's own JSON actions and tool_result blocks
as observations; a reply's action comes back as a tool_use block (its id derived from the reply), a
final answer as text. The reply is read tolerantly: the JSON may sit in a code fence, with prose
around it or text after it. A reply that holds no readable action is sent back once as an
observation saying what was wrong; a second such reply stands as the answer in words. An unknown
tool needs nothing special: the loop settles the call as failed ("Unknown tool ..."), and that goes
back as an observation like any result.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any

from webapp.llm.client import ModelClient, ModelReply

CORRECTIONS = 1  # replies without a readable action sent back before the words stand as the answer

MARKER = "You have no built-in tool calling."
INSTRUCTIONS = """
You have no built-in tool calling. To use a tool, reply with exactly one JSON object and nothing else:
{{"thought": "why this step", "action": "<tool name>", "action_input": {{<the tool's arguments>}}}}
The result comes back to you as an observation. When you can answer without a tool, reply with:
{{"thought": "why you can answer", "final_answer": "<your answer to the support agent>"}}
One action per reply. The tools, with their JSON input schemas:
{tools}"""
TOOLS_HEADING = "The tools, with their JSON input schemas:\n"

NOT_READ = (
    "Observation: your last reply could not be read ({problem}). Reply with one JSON object: either "
    '{{"thought": ..., "action": ..., "action_input": {{...}}}} or {{"thought": ..., "final_answer": ...}}.'
)


class ReactClient(ModelClient):
    """A ModelClient for models that take tools as text (see the module docstring)."""

    takes_batches = False  # a reply may need a correction turn (generate), which one batch request cannot hold

    def generate(
        self,
        *,
        system: list[dict],
        messages: list[dict],
        tools: list[dict] | None = None,
        tool_choice: dict | None = None,  # (one action per reply already)
        on_text: Callable[[str], None] | None = None,
        on_tool_start: Callable[[str], None] | None = None,
        should_stop: Callable[[], bool] | None = None,
    ) -> ModelReply:
        """One reply, read as an action or a final answer. The raw JSON is not streamed to the page:
        the words come with the move's end."""
        request = as_text_request(system, messages, tools or [])
        usage: dict[str, int] = {}
        for attempt in range(CORRECTIONS + 1):
            reply = super().generate(**request, should_stop=should_stop)
            usage = {key: usage.get(key, 0) + value for key, value in reply.usage.items()}
            if reply.stop_reason == "cancelled":  # what streamed so far is JSON, not words for the page
                return _with_usage(ModelReply([], "cancelled", reply.model, reply.usage, reply.request_id), usage)
            text = "".join(block.get("text", "") for block in reply.content if block.get("type") == "text")
            action, problem = read_action(text)
            if action is not None or attempt == CORRECTIONS:
                break
            request["messages"] = [
                *request["messages"],
                {"role": "assistant", "content": [{"type": "text", "text": text.strip() or "(nothing)"}]},
                {"role": "user", "content": [{"type": "text", "text": NOT_READ.format(problem=problem)}]},
            ]
        content, stop_reason = _as_blocks(action, text, messages)
        if stop_reason == "tool_use" and on_tool_start:
            on_tool_start(content[-1]["name"])
        reply = ModelReply(content, stop_reason, reply.model, reply.usage, reply.request_id, reply.latency_ms)
        return _with_usage(reply, usage)

    def count_tokens(self, request: dict) -> int | None:
        text = as_text_request(request["system"], request["messages"], request.get("tools") or [])
        return super().count_tokens(text)


def as_text_request(system: list[dict], messages: list[dict], tools: list[dict]) -> dict:
    """The request as a model without tool use reads it: tools in the system prompt, the history's
    tool calls as its own JSON actions and their results as observations."""
    described = "\n".join(
        json.dumps(
            {"name": t["name"], "description": t.get("description", ""), "input_schema": t.get("input_schema", {})},
            ensure_ascii=False,
        )
        for t in tools
    )
    system = [
        *({key: value for key, value in block.items() if key != "cache_control"} for block in system),
        {"type": "text", "text": INSTRUCTIONS.format(tools=described or "(none)")},
    ]
    names: dict[str, str] = {}
    out: list[dict] = []
    for message in messages:
        texts = []
        for block in message["content"]:
            kind = block.get("type")
            if kind == "text" and block.get("text", "").strip():
                texts.append(block["text"])
            elif kind == "tool_use":
                names[block["id"]] = block["name"]
                texts.append(json.dumps({"action": block["name"], "action_input": block.get("input") or {}}))
            elif kind == "tool_result":
                content = block.get("content")
                result = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
                failed = " (failed)" if block.get("is_error") else ""
                texts.append(f"Observation from {names.get(block['tool_use_id'], 'the tool')}{failed}: {result}")
        if texts:
            out.append({"role": message["role"], "content": [{"type": "text", "text": "\n\n".join(texts)}]})
    return {"system": system, "messages": _merged(out)}


def read_action(text: str) -> tuple[dict | None, str]:
    """The first JSON object in `text` that is an action or a final answer, wherever it sits (a code
    fence, prose around it, text after it); else None and what was wrong."""
    decoder = json.JSONDecoder()
    found_json = False
    start = text.find("{")
    while start != -1:
        try:
            value, _ = decoder.raw_decode(text, start)
        except ValueError:
            start = text.find("{", start + 1)
            continue
        found_json = True
        if isinstance(value, dict):
            if isinstance(value.get("final_answer"), str):
                return value, ""
            if isinstance(value.get("action"), str) and value["action"]:
                action_input = value.get("action_input", {})
                if isinstance(action_input, str):  # some models send the input as a JSON string
                    try:
                        action_input = json.loads(action_input or "{}")
                    except ValueError:
                        return None, "its action_input is not a JSON object"
                if not isinstance(action_input, dict):
                    return None, "its action_input is not a JSON object"
                return {**value, "action_input": action_input}, ""
        start = text.find("{", start + 1)
    if found_json:
        return None, 'its JSON has neither an "action" nor a "final_answer"'
    return None, "it holds no JSON object"


def _as_blocks(action: dict | None, text: str, messages: list[dict]) -> tuple[list[dict], str]:
    if action is None:  # still unreadable after the correction: the words stand as the answer
        return [{"type": "text", "text": text.strip() or "(The model gave no answer.)"}], "end_turn"
    if "final_answer" in action:
        return [{"type": "text", "text": action["final_answer"].strip() or "(The model gave no answer.)"}], "end_turn"
    blocks = []
    if isinstance(action.get("thought"), str) and action["thought"].strip():
        blocks.append({"type": "text", "text": action["thought"].strip()})
    seed = json.dumps([len(messages), action], sort_keys=True, default=str)
    blocks.append(
        {
            "type": "tool_use",
            "id": "toolu_react_" + hashlib.sha256(seed.encode()).hexdigest()[:20],
            "name": action["action"],
            "input": action["action_input"],
        }
    )
    return blocks, "tool_use"


def _merged(messages: list[dict]) -> list[dict]:
    """Consecutive messages of one role joined, so the roles alternate."""
    out: list[dict] = []
    for message in messages:
        if out and out[-1]["role"] == message["role"]:
            out[-1]["content"][0]["text"] += "\n\n" + message["content"][0]["text"]
        else:
            out.append({"role": message["role"], "content": [dict(message["content"][0])]})
    return out


def _with_usage(reply: ModelReply, usage: dict[str, Any]) -> ModelReply:
    reply.usage = usage or reply.usage
    return reply
