"""``WorkerConfig``: every flag of ``gpuscope worker``, parsed once from argv and environment.

Each flag ``--some-flag`` has the environment twin ``GPUSCOPE_SOME_FLAG``; a flag on
the command line wins over its twin. Validation errors name the flag.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, Final

BATCHING_MODES: Final = ("none", "static", "dynamic", "continuous")
DEVICES: Final = ("auto", "cuda", "cpu")
ENDPOINTS: Final = ("embeddings", "completions")
LOG_LEVELS: Final = ("critical", "error", "warning", "info", "debug")


class ConfigError(ValueError):
    """A flag (or its environment twin) has a value the worker cannot use."""


@dataclass(frozen=True)
class WorkerConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    model_name: str = "gpuscope-synthetic"
    serve: tuple[str, ...] = ENDPOINTS
    batching: str = "dynamic"
    max_batch_size: int = 16
    max_queue_delay_ms: float = 5.0
    max_queue: int = 256
    request_timeout_s: float = 30.0
    device: str = "auto"
    hidden_size: int = 256
    layers: int = 2
    vocab_size: int = 512
    max_context: int = 512
    max_new_tokens: int = 256
    seed: int = 0
    gpu_uuid: str | None = None
    otlp_endpoint: str | None = None
    service_name: str = "gpuscope-worker"
    no_tracing: bool = False
    log_level: str = "info"
    shutdown_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        _check_choice("--batching", self.batching, BATCHING_MODES)
        _check_choice("--device", self.device, DEVICES)
        _check_choice("--log-level", self.log_level, LOG_LEVELS)
        for endpoint in self.serve:
            _check_choice("--serve", endpoint, ENDPOINTS)
        if not self.serve:
            raise ConfigError("--serve: name at least one of embeddings, completions")
        if not self.model_name:
            raise ConfigError("--model-name: must not be empty")
        _check_range("--port", self.port, 0, 65535)
        for flag, value in (
            ("--max-batch-size", self.max_batch_size),
            ("--max-queue", self.max_queue),
            ("--hidden-size", self.hidden_size),
            ("--layers", self.layers),
            ("--max-new-tokens", self.max_new_tokens),
        ):
            _check_range(flag, value, 1, None)
        _check_range("--vocab-size", self.vocab_size, 300, None)  # bytes + specials
        _check_range("--max-context", self.max_context, 2, None)
        _check_range("--max-queue-delay-ms", self.max_queue_delay_ms, 0, None)
        for flag, seconds in (
            ("--request-timeout-s", self.request_timeout_s),
            ("--shutdown-timeout-s", self.shutdown_timeout_s),
        ):
            if not seconds > 0:
                raise ConfigError(f"{flag}: must be greater than 0, got {seconds}")
        if self.gpu_uuid is not None and not self.gpu_uuid.startswith(("GPU-", "MIG-")):
            raise ConfigError(f"--gpu-uuid: expected 'GPU-…' or 'MIG-…', got {self.gpu_uuid!r}")


def _check_choice(flag: str, value: str, choices: Sequence[str]) -> None:
    if value not in choices:
        raise ConfigError(f"{flag}: expected one of {', '.join(choices)}, got {value!r}")


def _check_range(flag: str, value: float, low: float, high: float | None) -> None:
    if value < low or (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise ConfigError(f"{flag}: must be {bound}, got {value}")


def env_name(field_name: str) -> str:
    """The environment twin of a config field: ``max_batch_size`` -> GPUSCOPE_MAX_BATCH_SIZE."""
    return "GPUSCOPE_" + field_name.upper()


def _flag(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


_HELP: Final = {
    "host": "address to bind",
    "port": "port to bind (0: any free port)",
    "model_name": "model name the endpoints answer to (the 'model' field of requests)",
    "serve": "comma-separated endpoints to serve: embeddings, completions",
    "batching": "scheduling strategy: none, static, dynamic or continuous",
    "max_batch_size": "requests per batch (sequences per iteration under continuous)",
    "max_queue_delay_ms": "dynamic batching: how long a forming batch waits to fill",
    "max_queue": "queued requests beyond which new ones get 429",
    "request_timeout_s": "a request not answered within this many seconds gets 504",
    "device": "compute backend: auto (CUDA if torch sees a GPU), cuda, cpu (NumPy)",
    "hidden_size": "model width of the synthetic models",
    "layers": "layers of the synthetic models",
    "vocab_size": "vocabulary of the synthetic token generator (at least 300)",
    "max_context": "longest prompt + generation, in tokens",
    "max_new_tokens": "largest max_tokens a completion request may ask for",
    "seed": "seed of the synthetic models' weights",
    "gpu_uuid": "UUID of a simulated GPU to report where no real one exists",
    "otlp_endpoint": "OTLP/HTTP traces URL (default: the local gpuscope exporter)",
    "service_name": "service.name of the worker's spans",
    "no_tracing": "do not export spans",
    "log_level": "uvicorn and worker log level",
    "shutdown_timeout_s": "on shutdown, how long in-flight requests may take to finish",
}


def _convert(field_name: str, kind: Any, raw: str) -> Any:
    """Turn a flag's text into its field's type; errors name the flag."""
    flag = _flag(field_name)
    try:
        if field_name == "serve":
            return tuple(part.strip() for part in raw.split(",") if part.strip())
        if kind in ("int",):
            return int(raw)
        if kind in ("float",):
            return float(raw)
        if kind in ("bool",):
            lowered = raw.strip().lower()
            if lowered in ("1", "true", "yes", "on"):
                return True
            if lowered in ("0", "false", "no", "off", ""):
                return False
            raise ValueError(raw)
    except ValueError:
        raise ConfigError(f"{flag}: cannot read {raw!r} as {kind}") from None
    return raw or None if kind == "str | None" else raw


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpuscope worker",
        description="Reference inference worker: OpenAI-compatible endpoints over batching "
        "schedulers. Every flag has a GPUSCOPE_* environment twin.",
    )
    for field in fields(WorkerConfig):
        flag = _flag(field.name)
        help_text = f"{_HELP[field.name]} [{env_name(field.name)}]"
        if field.type == "bool":
            parser.add_argument(flag, action="store_const", const="true", help=help_text)
        else:
            default = field.default
            shown = ",".join(default) if isinstance(default, tuple) else default
            parser.add_argument(flag, metavar="VALUE", help=f"{help_text} (default {shown})")
    return parser


def parse_config(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> WorkerConfig:
    """Flags from ``argv``, else their ``GPUSCOPE_*`` twins in ``environ``, else defaults."""
    environ = os.environ if environ is None else environ
    namespace = build_parser().parse_args(list(argv))
    values: dict[str, Any] = {}
    for field in fields(WorkerConfig):
        raw = getattr(namespace, field.name)
        if raw is None:
            raw = environ.get(env_name(field.name))
        if raw is not None:
            values[field.name] = _convert(field.name, field.type, raw)
    return WorkerConfig(**values)
