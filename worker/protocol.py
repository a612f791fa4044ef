"""The OpenAI wire format, requests: validation into frozen request objects, free of I/O.

Validation turns a decoded JSON body into a frozen request object or raises
``InvalidRequest`` naming the offending parameter; the app answers it with an
OpenAI-style error body (``{"error": {"message", "type", "param", "code"}}``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

MAX_EMBEDDING_INPUTS: Final = 64
MAX_PROMPTS: Final = 16
MAX_STOP_SEQUENCES: Final = 4
DEFAULT_MAX_TOKENS: Final = 16
CONTEXT_LENGTH_EXCEEDED: Final = "context_length_exceeded"  # OpenAI's error code


class InvalidRequest(Exception):
    """A request the worker refuses as sent (4xx)."""

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        status: int = 400,
        code: str | None = None,
        kind: str = "invalid_request_error",
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.param = param
        self.status = status
        self.code = code
        self.kind = kind
        self.headers = headers


def error_body(
    message: str, *, kind: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


@dataclass(frozen=True)
class Limits:
    """What the served models accept."""

    model_name: str
    vocab_size: int
    max_context: int
    max_new_tokens: int
    dimensions: int


@dataclass(frozen=True)
class EmbeddingsRequest:
    inputs: tuple[tuple[int, ...], ...]
    base64: bool
    dimensions: int | None

    @property
    def input_tokens(self) -> int:
        return sum(len(tokens) for tokens in self.inputs)


@dataclass(frozen=True)
class GenerationOptions:
    """What completions and chat completions share: how much to generate and how to answer."""

    max_tokens: int
    stream: bool
    include_usage: bool
    stop: tuple[str, ...]


@dataclass(frozen=True)
class CompletionRequest:
    prompts: tuple[tuple[int, ...], ...]  # each its own choice
    options: GenerationOptions


Encoder = Callable[[str], list[int]]


def require_object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise InvalidRequest("the request body must be a JSON object")
    return body


def check_model(body: dict[str, Any], limits: Limits) -> None:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("'model' is required and must be a string", param="model")
    if model != limits.model_name:
        raise InvalidRequest(
            f"the model '{model}' does not exist; this worker serves '{limits.model_name}'",
            param="model",
            status=404,
            code="model_not_found",
        )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(body: dict[str, Any], name: str, low: float, high: float) -> None:
    """Accept an optional number within [low, high]; the synthetic models ignore it."""
    value = body.get(name)
    if value is None:
        return
    if not _is_int(value) and not isinstance(value, float):
        raise InvalidRequest(f"'{name}' must be a number", param=name)
    if not (low <= value <= high) or math.isnan(value):
        raise InvalidRequest(f"'{name}' must be between {low} and {high}, got {value}", param=name)


def _token_list(value: list[Any], param: str, limits: Limits) -> tuple[int, ...]:
    for token in value:
        if not _is_int(token) or not 0 <= token < limits.vocab_size:
            raise InvalidRequest(
                f"'{param}' holds token {token!r}; token ids must be integers in "
                f"0..{limits.vocab_size - 1}",
                param=param,
            )
    return tuple(value)


def _encode(text: str, param: str, encode: Encoder) -> list[int]:
    """``text`` through the tokenizer; JSON may carry a lone surrogate (``"\\ud800"``),
    which no UTF-8 tokenizer can take: a 400, not a crash."""
    try:
        return encode(text)
    except UnicodeEncodeError as exc:
        raise InvalidRequest(f"'{param}' is not valid Unicode: {exc.reason}", param=param) from None


def tokenize(value: Any, param: str, limits: Limits, encode: Encoder) -> tuple[int, ...]:
    """One text (string or token ids) as token ids, non-empty and within the context."""
    if isinstance(value, str):
        tokens = tuple(_encode(value, param, encode))
    elif isinstance(value, list):
        tokens = _token_list(value, param, limits)
    else:
        raise InvalidRequest(f"'{param}' must be a string or a list of token ids", param=param)
    if not tokens:
        raise InvalidRequest(f"'{param}' must not be empty", param=param)
    if len(tokens) >= limits.max_context:
        raise InvalidRequest(
            f"'{param}' has {len(tokens)} tokens; this model's context is {limits.max_context}",
            param=param,
            code=CONTEXT_LENGTH_EXCEEDED,
        )
    return tokens


def _texts(value: Any, param: str) -> list[Any]:
    """The texts of an input that may hold one or several (strings or token lists)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value and all(_is_int(v) for v in value):
        return [value]  # one text given as token ids
    if isinstance(value, list) and value:
        return value
    raise InvalidRequest(
        f"'{param}' must be a non-empty string, list of strings or list of token ids",
        param=param,
    )


def parse_embeddings(body: Any, limits: Limits, encode: Encoder) -> EmbeddingsRequest:
    body = require_object(body)
    check_model(body, limits)
    texts = _texts(body.get("input"), "input")
    if len(texts) > MAX_EMBEDDING_INPUTS:
        raise InvalidRequest(
            f"'input' holds {len(texts)} texts; at most {MAX_EMBEDDING_INPUTS} per request",
            param="input",
        )
    inputs = tuple(tokenize(text, "input", limits, encode) for text in texts)
    encoding = body.get("encoding_format", "float")
    if encoding not in ("float", "base64"):
        raise InvalidRequest(
            "'encoding_format' must be 'float' or 'base64'", param="encoding_format"
        )
    dimensions = body.get("dimensions")
    if dimensions is not None and (
        not _is_int(dimensions) or not 1 <= dimensions <= limits.dimensions
    ):
        raise InvalidRequest(
            f"'dimensions' must be an integer in 1..{limits.dimensions}", param="dimensions"
        )
    return EmbeddingsRequest(inputs, encoding == "base64", dimensions)


def parse_completion(body: Any, limits: Limits, encode: Encoder) -> CompletionRequest:
    body = require_object(body)
    check_model(body, limits)
    texts = _texts(body.get("prompt"), "prompt")
    if len(texts) > MAX_PROMPTS:
        raise InvalidRequest(
            f"'prompt' holds {len(texts)} prompts; at most {MAX_PROMPTS} per request",
            param="prompt",
        )
    prompts = tuple(tokenize(text, "prompt", limits, encode) for text in texts)
    best_of = body.get("best_of")
    if best_of not in (None, 1):
        raise InvalidRequest("only best_of=1 is supported", param="best_of")
    for name in ("logprobs", "suffix"):
        if body.get(name) is not None:
            raise InvalidRequest(f"'{name}' is not supported by this worker", param=name)
    if body.get("echo") not in (None, False):  # the openai client sends null for None
        raise InvalidRequest("'echo' is not supported by this worker", param="echo")
    max_tokens = body.get("max_tokens")
    options = generation_options(body, limits, max(map(len, prompts)), max_tokens, "max_tokens")
    return CompletionRequest(prompts, options)


def generation_options(
    body: dict[str, Any],
    limits: Limits,
    longest_prompt: int,
    max_tokens: Any,
    param: str,
    *,
    default: int | None = DEFAULT_MAX_TOKENS,
) -> GenerationOptions:
    """The options both generation endpoints share; ``max_tokens`` was read as ``param``.
    Without one, ``default`` tokens (16 for completions, as OpenAI's legacy endpoint);
    with ``default`` None (chat, which has no small default in OpenAI's API) as many as
    the context leaves, up to the worker's ``--max-new-tokens``."""
    if max_tokens is None:
        room = limits.max_context - 1 - longest_prompt
        max_tokens = min(limits.max_new_tokens, room) if default is None else default
        if max_tokens < 1:
            raise InvalidRequest(
                f"the prompt ({longest_prompt} tokens) leaves no room for an answer in this "
                f"model's context of {limits.max_context} tokens",
                code=CONTEXT_LENGTH_EXCEEDED,
            )
    if not _is_int(max_tokens) or not 1 <= max_tokens <= limits.max_new_tokens:
        raise InvalidRequest(
            f"'{param}' must be an integer in 1..{limits.max_new_tokens}", param=param
        )
    if longest_prompt + 1 + max_tokens > limits.max_context:
        raise InvalidRequest(
            f"prompt ({longest_prompt} tokens) plus {param} ({max_tokens}) exceed this "
            f"model's context of {limits.max_context} tokens",
            param=param,
            code=CONTEXT_LENGTH_EXCEEDED,
        )
    stream = body.get("stream")
    if stream is None:  # the openai client sends null for stream=None; the API's default
        stream = False
    if not isinstance(stream, bool):
        raise InvalidRequest("'stream' must be true or false", param="stream")
    _check_sampling(body)
    return GenerationOptions(
        max_tokens, stream, _include_usage(body, stream), _stop(body.get("stop"))
    )


def _check_sampling(body: dict[str, Any]) -> None:
    """Decoding is greedy: accept only the settings under which greedy is what they ask for."""
    n = body.get("n", 1)
    if n is not None and (not _is_int(n) or n != 1):
        raise InvalidRequest(
            "only n=1 is supported: decoding is greedy, so every choice would be the same",
            param="n",
        )
    _number(body, "temperature", 0, 2)
    if body.get("temperature") not in (None, 0):
        raise InvalidRequest(
            "this worker decodes greedily: 'temperature' must be 0 or left out", param="temperature"
        )
    _number(body, "top_p", 0, 1)  # greedy keeps the top token, inside any nucleus
    for name in ("presence_penalty", "frequency_penalty"):
        _number(body, name, -2, 2)
        if body.get(name) not in (None, 0):
            raise InvalidRequest(f"'{name}' is not supported by this worker", param=name)
    seed = body.get("seed")
    if seed is not None and not _is_int(seed):
        raise InvalidRequest("'seed' must be an integer", param="seed")


def _include_usage(body: dict[str, Any], stream: bool) -> bool:
    options = body.get("stream_options")
    if options is None:
        return False
    if not stream:  # as OpenAI's API and vLLM answer
        raise InvalidRequest(
            "'stream_options' is only allowed when 'stream' is true", param="stream_options"
        )
    if not isinstance(options, dict):
        raise InvalidRequest("'stream_options' must be an object", param="stream_options")
    include_usage = options.get("include_usage")
    if include_usage is not None and not isinstance(include_usage, bool):
        raise InvalidRequest(
            "'stream_options.include_usage' must be true or false", param="stream_options"
        )
    return bool(include_usage)


def _stop(value: Any) -> tuple[str, ...]:
    stops = [value] if isinstance(value, str) else value
    if stops is None:
        return ()
    if (
        not isinstance(stops, list)
        or len(stops) > MAX_STOP_SEQUENCES
        or not all(isinstance(stop, str) and stop for stop in stops)
    ):
        raise InvalidRequest(
            f"'stop' must be a non-empty string or a list of at most {MAX_STOP_SEQUENCES}",
            param="stop",
        )
    return tuple(stops)
