"""``/v1/chat/completions``: messages through a chat template into a prompt, and chat bodies.

The chat template is deliberately simple (the synthetic tokenizer is UTF-8 bytes)::

    <|system|>
    You are terse.
    <|user|>
    Hello
    <|assistant|>

one ``<|role|>`` line then the content and a newline per message, and an open
``<|assistant|>`` line for the answer. ``developer`` messages render as ``system``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from gpuscope.worker.protocol import (
    Encoder,
    GenerationOptions,
    InvalidRequest,
    Limits,
    check_model,
    generation_options,
    require_object,
    tokenize,
)
from gpuscope.worker.responses import CompletionIds

ROLES: Final = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
UNSUPPORTED: Final = ("tools", "tool_choice", "functions", "function_call", "top_logprobs")


@dataclass(frozen=True)
class ChatRequest:
    prompt: tuple[int, ...]
    options: GenerationOptions


def render(messages: Sequence[tuple[str, str]]) -> str:
    """The prompt text of ``(role, content)`` messages, ready for the assistant's answer."""
    turns = "".join(f"<|{role}|>\n{content}\n" for role, content in messages)
    return f"{turns}<|assistant|>\n"


def _content(value: Any, param: str) -> str:
    """A message's text: a string, or a list of ``{"type": "text", "text": ...}`` parts."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value:
        texts = []
        for i, part in enumerate(value):
            if not isinstance(part, dict) or part.get("type") != "text":
                raise InvalidRequest(
                    f"'{param}[{i}]': only text parts are supported", param=f"{param}[{i}]"
                )
            text = part.get("text")
            if not isinstance(text, str):
                raise InvalidRequest(f"'{param}[{i}].text' must be a string", param=param)
            texts.append(text)
        return "".join(texts)
    raise InvalidRequest(f"'{param}' must be a string or a list of text parts", param=param)


def _messages(value: Any) -> list[tuple[str, str]]:
    if not isinstance(value, list) or not value:
        raise InvalidRequest("'messages' must be a non-empty list", param="messages")
    messages = []
    for i, message in enumerate(value):
        param = f"messages[{i}]"
        if not isinstance(message, dict):
            raise InvalidRequest(f"'{param}' must be an object", param=param)
        role = message.get("role")
        if not isinstance(role, str) or role not in ROLES:
            raise InvalidRequest(
                f"'{param}.role' must be one of {', '.join(ROLES)}, got {role!r}",
                param=f"{param}.role",
            )
        messages.append((ROLES[role], _content(message.get("content"), f"{param}.content")))
    return messages


def parse_chat(body: Any, limits: Limits, encode: Encoder) -> ChatRequest:
    body = require_object(body)
    check_model(body, limits)
    prompt = tokenize(render(_messages(body.get("messages"))), "messages", limits, encode)
    for name in UNSUPPORTED:
        if body.get(name) is not None:
            raise InvalidRequest(f"'{name}' is not supported by this worker", param=name)
    if body.get("logprobs") not in (None, False):
        raise InvalidRequest("'logprobs' is not supported by this worker", param="logprobs")
    response_format = body.get("response_format")
    if response_format is not None and response_format != {"type": "text"}:
        raise InvalidRequest("only text responses are supported", param="response_format")
    # The newer name wins, as in OpenAI's API.
    param = (
        "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    )
    options = generation_options(body, limits, len(prompt), body.get(param), param, default=None)
    return ChatRequest(prompt, options)


class ChatBodies:
    """``/v1/chat/completions`` bodies: the whole answer, and the chunks of a stream."""

    def __init__(self, ids: CompletionIds, include_usage: bool) -> None:
        self.ids = ids
        self.include_usage = include_usage

    def whole(self, choices: Sequence[tuple[str, str]], usage: dict[str, int]) -> dict[str, Any]:
        body = self.ids.envelope(
            "chat.completion",
            [
                {
                    "index": i,
                    "message": {"role": "assistant", "content": text},
                    "logprobs": None,
                    "finish_reason": reason,
                }
                for i, (text, reason) in enumerate(choices)
            ],
        )
        body["usage"] = usage
        return body

    def opening(self, index: int) -> list[dict[str, Any]]:
        """A stream opens with the role, as OpenAI's does."""
        return [self._chunk(index, {"role": "assistant", "content": ""}, None)]

    def chunk(self, index: int, text: str, finish_reason: str | None) -> dict[str, Any]:
        return self._chunk(index, {"content": text} if text else {}, finish_reason)

    def usage_chunk(self, usage: dict[str, int]) -> dict[str, Any]:
        body = self.ids.envelope("chat.completion.chunk", [])
        body["usage"] = usage
        return body

    def _chunk(
        self, index: int, delta: dict[str, Any], finish_reason: str | None
    ) -> dict[str, Any]:
        choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        body = self.ids.envelope("chat.completion.chunk", [choice])
        if self.include_usage:
            body["usage"] = None
        return body
