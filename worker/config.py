"""``WorkerConfig``: every flag of ``gpuscope worker``, parsed once from argv and environment.

Each flag ``--some-flag`` has the environment twin ``GPUSCOPE_SOME_FLAG``; a flag on
the command line wins over its twin. Validation errors name the flag.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from gpuscope.contract.http import DEFAULT_TRACES_URL
from gpuscope.flags import (
    LOG_LEVELS,
    ConfigError,
    Settings,
    at_least,
    between,
    check_choice,
    http_url,
    not_empty,
    one_of,
    option,
    positive,
)
from gpuscope.middleware.phase_spans import PhaseSpans

__all__ = ["BatchingMode", "ConfigError", "WorkerConfig"]


class BatchingMode(StrEnum):
    """How batches form from the queue (``--batching``); ``gpuscope.worker.scheduler``
    describes each."""

    NONE = "none"
    STATIC = "static"
    DYNAMIC = "dynamic"
    CONTINUOUS = "continuous"


DEVICES: Final = ("auto", "cuda", "cpu")
ENDPOINTS: Final = ("embeddings", "completions")
_COUNT = at_least(1)


def _endpoints(flag: str, serve: tuple[str, ...]) -> None:
    for endpoint in serve:
        check_choice(flag, endpoint, ENDPOINTS)
    if not serve:
        raise ConfigError(f"{flag}: name at least one of {', '.join(ENDPOINTS)}")


def _gpu_uuid(flag: str, uuid: str) -> None:
    if not uuid.startswith(("GPU-", "MIG-")):
        raise ConfigError(f"{flag}: expected 'GPU-…' or 'MIG-…', got {uuid!r}")


@dataclass(frozen=True)
class WorkerConfig(
    Settings,
    prog="gpuscope worker",
    description="Reference inference worker: OpenAI-compatible endpoints over batching schedulers.",
):
    host: str = option("127.0.0.1", help="address to bind", metavar="HOST")
    port: int = option(8000, help="port to bind (0: any free port)", check=between(0, 65535))
    model_name: str = option(
        "gpuscope-synthetic",
        help="model name the endpoints answer to (the 'model' field of requests)",
        metavar="NAME",
        check=not_empty,
    )
    serve: tuple[str, ...] = option(
        ENDPOINTS,
        help="comma-separated endpoints to serve: " + ", ".join(ENDPOINTS),
        metavar="ENDPOINT,...",
        check=_endpoints,
    )
    batching: BatchingMode = option(BatchingMode.DYNAMIC, help="how batches form from the queue")
    max_batch_size: int = option(
        16,
        help="requests per batch (sequences per iteration under continuous)",
        unit="requests",
        check=_COUNT,
    )
    max_queue_delay_ms: float = option(
        5.0, help="dynamic batching: how long a forming batch waits to fill", check=at_least(0)
    )
    max_queue: int = option(
        256, help="queued requests beyond which new ones get 429", unit="requests", check=_COUNT
    )
    request_timeout_s: float = option(
        30.0, help="a request not answered within this time gets 504", check=positive
    )
    device: str = option(
        "auto",
        help="compute backend: auto (CUDA if torch sees a GPU), cuda, cpu (NumPy)",
        check=one_of(DEVICES),
    )
    cpu_threads: int = option(
        1,
        help="threads of the CPU backend's matrix products (BLAS, or torch on the CPU); 0 "
        "keeps the library's default of one per core, which on a small machine fights the "
        "event loop for the same cores",
        check=between(0, 1024),
    )
    hidden_size: int = option(256, help="model width of the synthetic models", check=_COUNT)
    layers: int = option(2, help="layers of the synthetic models", check=_COUNT)
    vocab_size: int = option(
        512,
        help="vocabulary of the synthetic token generator (at least 300)",
        unit="tokens",
        check=at_least(300),  # bytes + specials
    )
    max_context: int = option(
        512, help="longest prompt + generation", unit="tokens", check=at_least(2)
    )
    max_new_tokens: int = option(
        256,
        help="largest max_tokens a completion request may ask for",
        unit="tokens",
        check=_COUNT,
    )
    kv_cache_blocks: int = option(
        512,
        help="blocks in the paged key/value cache (its size: blocks × block size positions; "
        "the default holds 16 full contexts of 512)",
        unit="blocks",
        check=_COUNT,
    )
    kv_block_size: int = option(
        16, help="positions per key/value cache block", unit="tokens", check=_COUNT
    )
    seed: int = option(0, help="seed of the synthetic models' weights")
    gpu_uuid: str | None = option(
        None,
        help="UUID of a simulated GPU to report where no real one exists",
        check=_gpu_uuid,
    )
    otlp_endpoint: str | None = option(
        None,
        help="OTLP/HTTP traces URL (default: the local gpuscope exporter)",
        check=http_url(DEFAULT_TRACES_URL),
    )
    service_name: str = option("gpuscope-worker", help="service.name of the worker's spans")
    no_tracing: bool = option(False, help="do not export spans")
    phase_spans: PhaseSpans = option(
        PhaseSpans.AUTO,
        help="queue, batch-wait and compute child spans under each request's span: auto "
        "emits them only where the spans reach a trace backend (the exporter's "
        "--forward-otlp, or an --otlp-endpoint that is one)",
    )
    log_level: str = option("info", help="uvicorn and worker log level", check=one_of(LOG_LEVELS))
    shutdown_timeout_s: float = option(
        10.0,
        help="on shutdown, how long in-flight requests may take to finish",
        check=positive,
    )
    max_body_bytes: int = option(
        4 * 1024 * 1024,
        help="largest request body accepted; a larger one gets 413 unread",
        check=_COUNT,
    )
    max_connections: int = option(
        512,
        help="open client connections at most; past it the oldest one without a request in "
        "flight is closed, and if every one has a request, the newcomer gets 503 (lowered "
        "to fit the file descriptor limit)",
        check=_COUNT,
    )
    header_timeout_s: float = option(
        10.0,
        help="time from a request's first byte to its complete head; a slower client's "
        "connection is closed",
        check=positive,
    )
    idle_timeout_s: float = option(
        5.0,
        help="how long a connection may stay open without a request (keep-alive, and before "
        "the first request)",
        check=positive,
    )
