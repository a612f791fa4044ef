"""``WorkerConfig``: every flag of ``gpuscope worker``, parsed once from argv and environment.

Each flag ``--some-flag`` has the environment twin ``GPUSCOPE_SOME_FLAG``; a flag on
the command line wins over its twin. Validation errors name the flag.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from gpuscope import flags
from gpuscope.flags import (
    LOG_LEVELS,
    ConfigError,
    check_choice,
    check_http_url,
    check_positive,
    check_range,
)

__all__ = ["BatchingMode", "ConfigError", "WorkerConfig", "build_parser", "parse_config"]


class BatchingMode(StrEnum):
    """How batches form from the queue (``--batching``); ``gpuscope.worker.scheduler``
    describes each."""

    NONE = "none"
    STATIC = "static"
    DYNAMIC = "dynamic"
    CONTINUOUS = "continuous"


DEVICES: Final = ("auto", "cuda", "cpu")
ENDPOINTS: Final = ("embeddings", "completions")


@dataclass(frozen=True)
class WorkerConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    model_name: str = "gpuscope-synthetic"
    serve: tuple[str, ...] = ENDPOINTS
    batching: BatchingMode = BatchingMode.DYNAMIC
    max_batch_size: int = 16
    max_queue_delay_ms: float = 5.0
    max_queue: int = 256
    request_timeout_s: float = 30.0
    device: str = "auto"
    cpu_threads: int = 1
    hidden_size: int = 256
    layers: int = 2
    vocab_size: int = 512
    max_context: int = 512
    max_new_tokens: int = 256
    kv_cache_blocks: int = 512
    kv_block_size: int = 16
    seed: int = 0
    gpu_uuid: str | None = None
    otlp_endpoint: str | None = None
    service_name: str = "gpuscope-worker"
    no_tracing: bool = False
    log_level: str = "info"
    shutdown_timeout_s: float = 10.0
    max_body_bytes: int = 4 * 1024 * 1024
    max_connections: int = 512
    header_timeout_s: float = 10.0
    idle_timeout_s: float = 5.0

    def __post_init__(self) -> None:
        # A mode given in code as its text is kept as the enum, like a parsed flag.
        object.__setattr__(self, "batching", batching_mode(self.batching))
        check_choice("--device", self.device, DEVICES)
        check_choice("--log-level", self.log_level, LOG_LEVELS)
        for endpoint in self.serve:
            check_choice("--serve", endpoint, ENDPOINTS)
        if not self.serve:
            raise ConfigError("--serve: name at least one of embeddings, completions")
        if not self.model_name:
            raise ConfigError("--model-name: must not be empty")
        check_range("--port", self.port, 0, 65535)
        for flag, value in (
            ("--max-batch-size", self.max_batch_size),
            ("--max-queue", self.max_queue),
            ("--hidden-size", self.hidden_size),
            ("--layers", self.layers),
            ("--max-new-tokens", self.max_new_tokens),
            ("--max-body-bytes", self.max_body_bytes),
            ("--kv-cache-blocks", self.kv_cache_blocks),
            ("--kv-block-size", self.kv_block_size),
            ("--max-connections", self.max_connections),
        ):
            check_range(flag, value, 1)
        check_range("--cpu-threads", self.cpu_threads, 0, 1024)
        check_range("--vocab-size", self.vocab_size, 300)  # bytes + specials
        check_range("--max-context", self.max_context, 2)
        check_range("--max-queue-delay-ms", self.max_queue_delay_ms, 0)
        for flag, seconds in (
            ("--request-timeout-s", self.request_timeout_s),
            ("--shutdown-timeout-s", self.shutdown_timeout_s),
            ("--header-timeout-s", self.header_timeout_s),
            ("--idle-timeout-s", self.idle_timeout_s),
        ):
            check_positive(flag, seconds)
        if self.otlp_endpoint is not None:
            check_http_url("--otlp-endpoint", self.otlp_endpoint, "http://127.0.0.1:9420/v1/traces")
        if self.gpu_uuid is not None and not self.gpu_uuid.startswith(("GPU-", "MIG-")):
            raise ConfigError(f"--gpu-uuid: expected 'GPU-…' or 'MIG-…', got {self.gpu_uuid!r}")


_HELP: Final = {
    "host": "address to bind",
    "port": "port to bind (0: any free port)",
    "model_name": "model name the endpoints answer to (the 'model' field of requests)",
    "serve": "comma-separated endpoints to serve: embeddings, completions",
    "batching": "scheduling strategy: " + ", ".join(BatchingMode),
    "max_batch_size": "requests per batch (sequences per iteration under continuous)",
    "max_queue_delay_ms": "dynamic batching: how long a forming batch waits to fill",
    "max_queue": "queued requests beyond which new ones get 429",
    "request_timeout_s": "a request not answered within this many seconds gets 504",
    "device": "compute backend: auto (CUDA if torch sees a GPU), cuda, cpu (NumPy)",
    "cpu_threads": (
        "threads of the CPU backend's matrix products (BLAS, or torch on the CPU); "
        "0 keeps the library's default of one per core, which on a small machine fights "
        "the event loop for the same cores"
    ),
    "hidden_size": "model width of the synthetic models",
    "layers": "layers of the synthetic models",
    "vocab_size": "vocabulary of the synthetic token generator (at least 300)",
    "max_context": "longest prompt + generation, in tokens",
    "max_new_tokens": "largest max_tokens a completion request may ask for",
    "kv_cache_blocks": "blocks in the paged key/value cache (its size: blocks × block size "
    "positions; the default holds 16 full contexts of 512)",
    "kv_block_size": "positions (tokens) per key/value cache block",
    "seed": "seed of the synthetic models' weights",
    "gpu_uuid": "UUID of a simulated GPU to report where no real one exists",
    "otlp_endpoint": "OTLP/HTTP traces URL (default: the local gpuscope exporter)",
    "service_name": "service.name of the worker's spans",
    "no_tracing": "do not export spans",
    "log_level": "uvicorn and worker log level",
    "shutdown_timeout_s": "on shutdown, how long in-flight requests may take to finish",
    "max_body_bytes": "largest request body accepted; a larger one gets 413 unread",
    "max_connections": "open client connections at most; past it the oldest one without a "
    "request in flight is closed, and if every one has a request, the newcomer gets 503 "
    "(lowered to fit the file descriptor limit)",
    "header_timeout_s": "seconds from a request's first byte to its complete head; a slower "
    "client's connection is closed",
    "idle_timeout_s": "seconds a connection may stay open without a request (keep-alive, "
    "and before the first request)",
}


def batching_mode(value: str) -> BatchingMode:
    """``value`` as a ``BatchingMode``; ``ConfigError`` naming ``--batching`` if it is none."""
    try:
        return BatchingMode(value)
    except ValueError:
        choices = ", ".join(BatchingMode)
        raise ConfigError(f"--batching: expected one of {choices}, got {value!r}") from None


def build_parser() -> argparse.ArgumentParser:
    return flags.build_parser(
        WorkerConfig,
        prog="gpuscope worker",
        description="Reference inference worker: OpenAI-compatible endpoints over batching "
        "schedulers. Every flag has a GPUSCOPE_* environment twin.",
        help=_HELP,
    )


def parse_config(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> WorkerConfig:
    """Flags from ``argv``, else their ``GPUSCOPE_*`` twins in ``environ``, else defaults."""
    return flags.parse_config(WorkerConfig, build_parser(), argv, environ)
