"""Function tools the reply call may use, and how they run (SPEC-001 ENV-17, ENV-23; seed 003).

A tool is a name, a strict JSON-schema for its arguments and a function. Async functions
run on the event loop (they only wait on the host); synchronous ones always run in a
worker thread (ENV-17), so the box keeps serving its pipe during a slow lookup. Results
are sanitised before they go back to the model (control characters out, length bounded).

What the model can do wrong (an unknown tool, arguments that are not JSON) and what the
host refuses (a fetch outside the allow-list) come back as legible results the model can
read; a tool that breaks (raises) ends the turn as Failed.
"""

from __future__ import annotations

import inspect
import json
import unicodedata
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from functools import partial
from typing import Any

import anyio

from box.memory import MemoryEngine
from box.protocol import Peer, RpcError
from box.protocol.models import HttpFetchParams, HttpFetchResult

MAX_RESULT_CHARS = 8_000
FETCH_MAX_BYTES = 200_000
SEARCH_LIMIT = 5

ToolFunction = Callable[[dict[str, Any]], Awaitable[str]] | Callable[[dict[str, Any]], str]


@dataclass(frozen=True)
class ToolCall:
    """One call the model asked for."""

    call_id: str
    name: str
    arguments: str  # JSON text, as the model wrote it


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]  # strict JSON schema: every property required, no others
    run: ToolFunction

    def chat_shape(self) -> dict[str, Any]:
        """chat/completions: nested under ``function``."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
                "strict": True,
            },
        }

    def responses_shape(self) -> dict[str, Any]:
        """The Responses API: flat (ENV-22)."""
        return {
            "type": "function",
            "name": self.name,
            "description": self.description,
            "parameters": self.parameters,
            "strict": True,
        }


def sanitize_result(text: str, limit: int = MAX_RESULT_CHARS) -> str:
    """What goes back to the model: printable text (newlines and tabs kept), bounded, the cut made visible."""
    kept = "".join(ch for ch in text if ch in "\n\t" or unicodedata.category(ch)[0] != "C")
    if len(kept) > limit:
        kept = kept[:limit] + f"\n[… {len(kept) - limit} more characters cut]"
    return kept


class ToolRegistry:
    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        for tool in tools:
            self.register(tool)

    def register(self, tool: Tool) -> None:
        self._tools[tool.name] = tool

    def names(self) -> list[str]:
        return list(self._tools)

    def selected(self, names: Iterable[str]) -> list[Tool]:
        """The tools named in the settings that exist here, in the settings' order; unknown names are skipped."""
        return [self._tools[name] for name in dict.fromkeys(names) if name in self._tools]

    async def execute(self, call: ToolCall) -> str:
        tool = self._tools.get(call.name)
        if tool is None:
            return f"error: there is no tool named {call.name[:64]!r}"
        try:
            arguments = json.loads(call.arguments or "{}")
        except ValueError:
            return "error: the arguments are not valid JSON"
        if not isinstance(arguments, dict):
            return "error: the arguments must be a JSON object"
        if inspect.iscoroutinefunction(tool.run):
            result = await tool.run(arguments)
        else:
            result = await anyio.to_thread.run_sync(partial(tool.run, arguments))  # ENV-17
        return sanitize_result(str(result))


# ------------------------------------------------------------------ the built-in tools


# Issue 38: a tool's arguments are bounded like the envelope (box.common.schema_bounds fits them per server).
URL_CHARS = 2_048  # box.protocol.models.MAX_URL_CHARS: what http.fetch takes
QUERY_CHARS = 300


def _string_parameter(name: str, description: str, max_chars: int) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {name: {"type": "string", "description": description, "maxLength": max_chars}},
        "required": [name],
        "additionalProperties": False,
    }


def web_fetch_tool(peer: Peer) -> Tool:
    """``web_fetch``: the host fetches the page (``http.fetch``), judged by its egress policy, text extracted there."""

    async def run(arguments: dict[str, Any]) -> str:
        url = str(arguments.get("url", "")).strip()
        if not url:
            return "error: give a url"
        try:
            result = await peer.request(
                "http.fetch", HttpFetchParams(url=url[:2048], max_bytes=FETCH_MAX_BYTES)
            )
        except RpcError as exc:
            return f"refused by the host: {exc.message}"
        assert isinstance(result, HttpFetchResult)
        cut = "\n[the page was cut at the size limit]" if result.truncated else ""
        return f"HTTP {result.status} {result.content_type}\n{result.text}{cut}"

    return Tool(
        "web_fetch",
        "Fetch a web page by URL and read its text. Only some sites are allowed; a refusal says so.",
        _string_parameter("url", "The absolute http(s) URL to fetch.", URL_CHARS),
        run,
    )


def search_tool(memory: MemoryEngine) -> Tool:
    """``search``: a deliberate search of the memory (issue 23, mechanisms 23-24); nothing without an engine.

    Async: the engine waits on the host's store and the gateway, it never scores vectors itself.
    """

    async def run(arguments: dict[str, Any]) -> str:
        query = str(arguments.get("query", "")).strip()
        if not query:
            return "error: give a query"
        found = await memory.search(query[:2_000], SEARCH_LIMIT)
        return "\n".join(f"- {item}" for item in found) if found else "nothing found in memory"

    return Tool(
        "search",
        "Search your memory for things you were told or experienced before.",
        _string_parameter("query", "What to look for, in a few words.", QUERY_CHARS),
        run,
    )


def builtin_tools(peer: Peer, memory: MemoryEngine) -> ToolRegistry:
    return ToolRegistry([web_fetch_tool(peer), search_tool(memory)])
