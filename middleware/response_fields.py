"""The model, operation and id of an OpenAI-shaped response, read from its first bytes.

An engine behind the zero-argument middleware (vLLM) never tells gpuscope which model a
request used. Its responses do: every completion, chat and embeddings body, and every
streamed chunk, opens with ``"object"`` and ``"model"`` before any generated content.
Only the first ``SNIFF_BYTES`` of the first body chunk are searched, so the cost is
constant whatever the response size, and nothing is buffered or changed. The model is
the served model name, the same value vLLM puts in the ``model_name`` label of its own
metrics.

Only a successful (2xx) response is read (the middleware decides): an error body may
echo what the client sent, and FastAPI's 422 does, so a client could otherwise name any
model it likes. The operation comes from ``"object"`` and the route together: OpenAI's
``"list"`` is the embeddings response and also ``/v1/models``' answer, so it names the
embeddings operation only on an embeddings route or when its items are ``"embedding"``
objects; anything else stays unknown.
"""

from __future__ import annotations

import re
from typing import Final, NamedTuple

SNIFF_BYTES: Final = 1024
MAX_MODEL_LENGTH: Final = 128
_MODEL = re.compile(rb'"model"\s*:\s*"([^"\\\x00-\x1f]{1,128})"')
_OBJECT = re.compile(rb'"object"\s*:\s*"([a-z._]{1,40})"')
_EMBEDDING_ITEM = re.compile(rb'"object"\s*:\s*"embedding"')
_ID = re.compile(rb'"id"\s*:\s*"([A-Za-z0-9_.:-]{1,128})"')
# OpenAI's ``object`` values -> gen_ai.operation.name; ``"list"`` needs more (``_operation``)
_OPERATIONS: Final = {
    b"text_completion": "text_completion",
    b"chat.completion": "chat",
    b"chat.completion.chunk": "chat",
}
_LIST: Final = b"list"
EMBEDDINGS: Final = "embeddings"
SNIFFED_CONTENT_TYPES: Final = (b"application/json", b"text/event-stream")


def sniffable(headers: object) -> bool:
    """Whether an ``http.response.start`` header list announces JSON or Server-Sent Events."""
    if not isinstance(headers, list | tuple):
        return False
    for item in headers:
        if isinstance(item, list | tuple) and len(item) == 2:
            name, value = item
            if isinstance(name, bytes) and name.lower() == b"content-type":
                return isinstance(value, bytes) and value.lower().startswith(SNIFFED_CONTENT_TYPES)
    return False


class ResponseFields(NamedTuple):
    model: str | None
    operation: str | None
    response_id: str | None


def read(body: bytes, route: str | None = None) -> ResponseFields:
    """What the start of ``body`` says; None where absent. ``route`` is the request's
    route template (or path), which tells an embeddings list from another list."""
    model, operation = model_and_operation(body, route)
    found = _ID.search(body[:SNIFF_BYTES])
    return ResponseFields(model, operation, found.group(1).decode() if found else None)


def model_and_operation(body: bytes, route: str | None = None) -> tuple[str | None, str | None]:
    """``(model, operation)`` found in the start of ``body``; None where absent."""
    head = body[:SNIFF_BYTES]
    model_match = _MODEL.search(head)
    model = None
    if model_match is not None:
        text = model_match.group(1).decode("utf-8", "replace")
        model = text if text.isprintable() else None
    object_match = _OBJECT.search(head)
    operation = _operation(object_match.group(1), head, route) if object_match else None
    return model, operation


def _operation(kind: bytes, head: bytes, route: str | None) -> str | None:
    if kind != _LIST:
        return _OPERATIONS.get(kind)
    # A list is an embeddings response on an embeddings route, or when it lists
    # embeddings; /v1/models (a list of "model" objects) and any other list are unknown.
    on_embeddings_route = route is not None and route.rstrip("/").endswith("/embeddings")
    if on_embeddings_route or _EMBEDDING_ITEM.search(head) is not None:
        return EMBEDDINGS
    return None
