"""The Responses door's tools: what a client offers becomes chat-completions functions, and the calls a
model makes go back in the shape the client offered them.

- ``function`` tools pass as they are; ``namespace`` tools (Codex groups its tools so) are unpacked into
  their functions under their own names (``namespace__name`` only where two namespaces share one), and
  a call goes back as ``function_call`` with its ``namespace``, as the client expects.
- ``custom`` tools (free-form text input, maybe a grammar) become a function taking ``{"input": string}``
  (no chat backend takes a grammar), and a call goes back as ``custom_tool_call`` with that input.
- Hosted tools (web search, file search, code interpreter, ...) run on OpenAI's side: no backend here
  runs them, and offering one as a function would have the model "call" something that answers
  nothing. They are left out of the tool list with a note (``x-gateway-notes``), so a client that
  always offers them (Codex offers ``web_search``) still works.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from gateway.errors import InvalidRequest

CUSTOM_INPUT = {
    "type": "object",
    "properties": {"input": {"type": "string", "description": "the tool's whole input, as free text"}},
    "required": ["input"],
}


@dataclass(frozen=True, slots=True)
class Offered:
    """One callable tool as the client named it."""

    name: str
    namespace: str | None = None
    custom: bool = False


@dataclass(slots=True)
class Toolbox:
    """The tools of one request: chat functions out, and the way back from a chat name."""

    functions: list[dict[str, Any]] = field(default_factory=list)
    by_chat_name: dict[str, Offered] = field(default_factory=dict)
    dropped: list[str] = field(default_factory=list)  # hosted tool types left out
    grammars: list[str] = field(default_factory=list)  # custom tools whose grammar nothing enforces

    def chat_name(self, name: Any, namespace: Any = None) -> str:
        """The chat function name of a call the client sends back (an earlier turn's call)."""
        for chat, offered in self.by_chat_name.items():
            if offered.name == name and offered.namespace == (namespace or None):
                return chat
        return f"{namespace}__{name}" if namespace else str(name)

    def offered(self, chat_name: str) -> Offered:
        return self.by_chat_name.get(chat_name) or Offered(chat_name)


def toolbox(tools: list[Any]) -> Toolbox:
    """``tools`` from the request and its ``additional_tools`` items, in order."""
    flat: list[tuple[Offered, dict[str, Any]]] = []
    box = Toolbox()
    for tool in tools:
        if not isinstance(tool, dict):
            raise InvalidRequest("tools: each tool must be an object", param="tools")
        _unpack(tool, None, flat, box)
    names = [offered.name for offered, _ in flat]
    for offered, function in flat:
        chat = offered.name
        if offered.namespace and names.count(chat) > 1:
            chat = f"{offered.namespace}__{chat}"
        if chat in box.by_chat_name:
            continue  # offered twice (e.g. again in additional_tools): once is enough
        box.by_chat_name[chat] = offered
        box.functions.append({"type": "function", "function": {**function, "name": chat}})
    return box


def _unpack(
    tool: dict[str, Any], namespace: str | None, flat: list[tuple[Offered, dict[str, Any]]], box: Toolbox
) -> None:
    kind, name = tool.get("type"), tool.get("name")
    if kind not in ("function", "custom", "namespace"):
        box.dropped.append(str(kind))
        return
    if not isinstance(name, str) or not name:
        raise InvalidRequest(f"tools: a {kind} tool needs a 'name'", param="tools")
    if kind == "function":
        function = {k: tool[k] for k in ("description", "parameters", "strict") if tool.get(k) is not None}
        flat.append((Offered(name, namespace), function))
    elif kind == "custom":
        given = tool.get("description")
        description = given if isinstance(given, str) else ""
        fmt = tool.get("format")
        if isinstance(fmt, dict) and fmt.get("type") == "grammar":
            # No chat backend takes a grammar: the model sees it, so it can follow it unforced.
            description += f"\nThe input follows this {fmt.get('syntax')} grammar:\n{fmt.get('definition')}"
            box.grammars.append(name)
        function = {"description": description.strip(), "parameters": CUSTOM_INPUT}
        flat.append((Offered(name, namespace, custom=True), function))
    elif namespace is None:  # a namespace (they do not nest)
        for inner in tool.get("tools") or ():
            if isinstance(inner, dict):
                _unpack(inner, name, flat, box)


def tool_notes(box: Toolbox) -> list[str]:
    """What the client should know about its tools: hosted ones left out, grammars not enforced."""
    notes = []
    if box.dropped:
        kinds = ", ".join(sorted(set(box.dropped)))
        notes.append(f"hosted tools not run by this gateway's backends were left out: {kinds}")
    if box.grammars:
        names = ", ".join(sorted(set(box.grammars))[:10])
        notes.append(
            f"custom tools offered as functions taking {{input}}, grammar shown but not enforced: {names}"
        )
    return notes


def call_arguments(arguments: str, offered: Offered) -> str:
    """A custom tool's input from the ``{"input": ...}`` arguments the model wrote (or the raw text)."""
    if not offered.custom:
        return arguments
    try:
        parsed = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return arguments
    value = parsed.get("input") if isinstance(parsed, dict) else None
    return value if isinstance(value, str) else arguments


def call_item(item: str, call_id: str, chat_name: str, arguments: str, box: Toolbox,
              status: str = "completed") -> dict[str, Any]:  # fmt: skip
    """The output item for a model's call: ``function_call`` (with its namespace) or ``custom_tool_call``."""
    offered = box.offered(chat_name)
    if offered.custom:
        done: dict[str, Any] = {"id": item, "type": "custom_tool_call", "status": status,
                                "call_id": call_id, "name": offered.name,
                                "input": call_arguments(arguments, offered)}  # fmt: skip
    else:
        done = {"id": item, "type": "function_call", "status": status, "call_id": call_id,
                "name": offered.name, "arguments": arguments}  # fmt: skip
    if offered.namespace:
        done["namespace"] = offered.namespace
    return done


def chat_tool_choice(choice: Any, box: Toolbox) -> Any:
    """The chat ``tool_choice`` for a Responses one; a hosted tool cannot be forced: refused."""
    if choice is None or isinstance(choice, str):
        return choice
    if not isinstance(choice, dict):
        raise InvalidRequest("'tool_choice' must be a string or an object", param="tool_choice")
    kind = choice.get("type")
    if kind in ("function", "custom"):
        name = choice.get("name")
        if not isinstance(name, str) or not name:
            raise InvalidRequest(f"tool_choice: a {kind} choice needs a 'name'", param="tool_choice")
        return {"type": "function", "function": {"name": box.chat_name(name, choice.get("namespace"))}}
    if kind == "allowed_tools":
        return choice.get("mode", "auto")
    raise InvalidRequest(
        f"tool_choice {kind!r} names a hosted tool, which this gateway's backends do not run",
        param="tool_choice",
    )
