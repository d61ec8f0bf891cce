"""The reply call with its bounded tool loop (seed 003 ToolExecution; SPEC-001 ENV-12, -15, -21..-24).

Each hop is one reply call, retried per ENV-12 (with the model chosen per ENV-15 / ENV-22,
see ``box.attempts``). When the model calls tools, their results are appended to the prompt
package and the next hop continues; ``tool_rounds`` (chat/completions, default 3) or
``responses_tool_rounds`` (Responses, default 4) hops may call tools, then one last hop goes
without tools and must answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from box import chat_api, responses_api
from box.attempts import ModelChooser, Sleep, with_attempts
from box.common.envelope import Envelope
from box.common.request_bodies import CHAT_PATH, RESPONSES_PATH, chat_body, responses_body
from box.context import PromptPackage
from box.model import ModelClient
from box.protocol.models import ResponderSettings
from box.tools import Tool, ToolRegistry

PURPOSE = "reply"


@dataclass
class ReplyCaller:
    client: ModelClient
    settings: ResponderSettings
    chooser: ModelChooser
    registry: ToolRegistry
    sleep: Sleep

    @property
    def tools(self) -> list[Tool]:
        return self.registry.selected(self.settings.tools)

    @property
    def timeout_s(self) -> float | None:
        """Issue 38: the attempt's own limit, told to the host so that the upstream request ends with it."""
        return self.settings.attempt_timeout_s

    def _model(self, package: PromptPackage) -> str:
        return self.chooser.choose(images=package.has_images, tool_results=package.tool_results > 0)

    async def answer(self, package: PromptPackage) -> Envelope:
        if self.settings.use_responses_api:  # ENV-22
            return await self._responses(package)
        return await self._chat(package)

    # ------------------------------------------------------------ chat/completions

    async def _chat(self, package: PromptPackage) -> Envelope:
        tools = self.tools
        rounds = self.settings.tool_rounds if tools else 0
        for hop in range(rounds + 1):
            attached = tools if hop < rounds else []  # the last hop answers without tools

            async def attempt(_: int, attached: list[Tool] = attached) -> chat_api.ChatReply:
                body = chat_body(
                    self.settings, self._model(package), package.chat_messages(), attached,
                    json_object=self.client.structured.refused,  # issue 38: the server refused json_schema
                )  # fmt: skip
                result = await self.client.call(CHAT_PATH, body, PURPOSE, timeout_s=self.timeout_s)
                return chat_api.parse_chat(result, tools_attached=bool(attached))

            reply = await with_attempts(
                attempt, sleep=self.sleep, base_s=self.settings.retry_backoff_s, chooser=self.chooser,
                structured=self.client.structured,
            )  # fmt: skip
            if reply.envelope is not None:
                return reply.envelope
            assert reply.echo is not None
            package.messages.append(reply.echo)
            for call in reply.calls:
                result = await self.registry.execute(call)
                package.messages.append(chat_api.tool_result_message(call, result))
                package.tool_results += 1
        raise AssertionError("the last hop has no tools, so it answers or fails")  # pragma: no cover

    # ------------------------------------------------------------ Responses API

    async def _responses(self, package: PromptPackage) -> Envelope:
        tools = self.tools
        rounds = self.settings.responses_tool_rounds if tools else 0  # ENV-23
        items: list[dict[str, Any]] = responses_api.input_items(package.conversation())
        for hop in range(rounds + 1):
            attached = tools if hop < rounds else []  # ENV-23: an exhausted loop forces a tool-less answer

            async def attempt(_: int, attached: list[Tool] = attached) -> responses_api.ResponsesReply:
                body = responses_body(self.settings, self._model(package), package.system, items, attached)
                result = await self.client.call(RESPONSES_PATH, body, PURPOSE, timeout_s=self.timeout_s)
                return responses_api.parse_responses(result, tools_attached=bool(attached))

            reply = await with_attempts(
                attempt, sleep=self.sleep, base_s=self.settings.retry_backoff_s, chooser=self.chooser
            )
            if reply.envelope is not None:
                return reply.envelope
            items.extend(reply.passback)  # ENV-23: reasoning + function_call items, input fields only
            for call in reply.calls:
                result = await self.registry.execute(call)
                items.append(responses_api.function_call_output(call, result))  # one per call_id
                package.tool_results += 1
        raise AssertionError("the last hop has no tools, so it answers or fails")  # pragma: no cover
