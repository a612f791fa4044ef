"""The OpenAI wire format, responses: the bodies and stream chunks the worker sends.

Pure functions of the request objects of ``protocol`` and the model's outputs.
"""

from __future__ import annotations

import base64
import time
import uuid
from collections.abc import Sequence
from typing import Any

import numpy as np

from gpuscope.worker.model_api import FloatArray
from gpuscope.worker.protocol import EmbeddingsRequest


def _encode_vector(vector: FloatArray, as_base64: bool) -> list[float] | str:
    if as_base64:
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    return [float(v) for v in vector]


def embeddings_body(
    request: EmbeddingsRequest, vectors: FloatArray, model_name: str
) -> dict[str, Any]:
    if request.dimensions is not None:
        vectors = vectors[:, : request.dimensions]
        vectors = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    data = [
        {"object": "embedding", "index": i, "embedding": _encode_vector(row, request.base64)}
        for i, row in enumerate(vectors)
    ]
    tokens = request.input_tokens
    return {
        "object": "list",
        "data": data,
        "model": model_name,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


class CompletionIds:
    """The id and creation time every chunk of one completion shares."""

    def __init__(self, model_name: str, prefix: str = "cmpl") -> None:
        self.id = f"{prefix}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.model_name = model_name

    def envelope(self, kind: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": kind,
            "created": self.created,
            "model": self.model_name,
            "choices": choices,
        }


class CompletionBodies:
    """``/v1/completions`` bodies: the whole answer, and the chunks of a stream."""

    def __init__(self, ids: CompletionIds, include_usage: bool) -> None:
        self.ids = ids
        self.include_usage = include_usage

    def whole(self, choices: Sequence[tuple[str, str]], usage: dict[str, int]) -> dict[str, Any]:
        """``choices``: (text, finish_reason) per choice, in order."""
        body = self.ids.envelope(
            "text_completion",
            [_text_choice(i, text, reason) for i, (text, reason) in enumerate(choices)],
        )
        body["usage"] = usage
        return body

    def opening(self, index: int) -> list[dict[str, Any]]:
        return []  # completions chunks carry text only

    def chunk(self, index: int, text: str, finish_reason: str | None) -> dict[str, Any]:
        body = self.ids.envelope("text_completion", [_text_choice(index, text, finish_reason)])
        if self.include_usage:
            body["usage"] = None  # as OpenAI: only the last chunk carries usage
        return body

    def usage_chunk(self, usage: dict[str, int]) -> dict[str, Any]:
        body = self.ids.envelope("text_completion", [])
        body["usage"] = usage
        return body


def _text_choice(index: int, text: str, finish_reason: str | None) -> dict[str, Any]:
    return {"text": text, "index": index, "logprobs": None, "finish_reason": finish_reason}


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def model_card(model_name: str, created: int, max_model_len: int) -> dict[str, Any]:
    return {
        "id": model_name,
        "object": "model",
        "created": created,
        "owned_by": "gpuscope",
        "root": model_name,
        "parent": None,
        "max_model_len": max_model_len,
    }


def models_body(cards: Sequence[dict[str, Any]]) -> dict[str, Any]:
    return {"object": "list", "data": list(cards)}
