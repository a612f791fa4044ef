"""The reference worker's batching flags written as Triton's and Ray Serve's settings.

``gpuscope tune`` names the best ``--max-batch-size`` / ``--max-queue-delay-ms`` for
the reference worker; these are the same two knobs in the engines that batch the same
way (a batch closes when full or when its window ends):

- Triton Inference Server's model configuration: ``max_batch_size`` and
  ``dynamic_batching { preferred_batch_size, max_queue_delay_microseconds }``;
- Ray Serve's ``@serve.batch(max_batch_size, batch_wait_timeout_s)``.

The numbers carry over only where the model, its batch cost and the load match what
was measured. The windows are also not timed from the same instant: the worker's and
Ray's start when the batcher takes a batch's first request, Triton's when that request
entered the queue. Continuous batching (``--batching continuous``) has no equivalent in
either: it is an LLM engine's own scheduler (vLLM's ``--max-num-seqs``, ...).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpuscope.contract.http import TRACES_PATH

if TYPE_CHECKING:
    from gpuscope.loadgen.tune import TuneOptions

CAVEAT = (
    "the same batching elsewhere (it transfers only where the model and the load "
    "match those measured here):"
)


@dataclass(frozen=True)
class Batching:
    """The worker's batching flags: ``--batching``, ``--max-batch-size``,
    ``--max-queue-delay-ms``."""

    mode: str
    max_batch_size: int
    max_queue_delay_ms: float

    @property
    def window_ms(self) -> float:
        # static batching takes whatever is queued when the device is free: no window
        return self.max_queue_delay_ms if self.mode == "dynamic" else 0.0


def triton(batching: Batching) -> str | None:
    """Triton's model configuration (``config.pbtxt``) for ``batching``; None where
    Triton's dynamic batcher has no equivalent."""
    if batching.mode == "none":
        return "no dynamic_batching block (each request runs alone)"
    if batching.mode not in ("static", "dynamic"):
        return None
    size, micros = batching.max_batch_size, round(batching.window_ms * 1000)
    return (
        f"max_batch_size: {size}  dynamic_batching {{ preferred_batch_size: [ {size} ]"
        f" max_queue_delay_microseconds: {micros} }}"
    )


def ray_serve(batching: Batching) -> str | None:
    """Ray Serve's decorator for ``batching``; None where ``@serve.batch`` has no
    equivalent."""
    if batching.mode == "none":
        return "no @serve.batch (each call runs alone)"
    if batching.mode not in ("static", "dynamic"):
        return None
    seconds = batching.window_ms / 1000
    return (
        f"@serve.batch(max_batch_size={batching.max_batch_size}, batch_wait_timeout_s={seconds:g})"
    )


def lines(batching: Batching) -> list[str]:
    """What ``gpuscope tune`` prints under its verdict."""
    found = [("Triton (config.pbtxt)", triton(batching)), ("Ray Serve", ray_serve(batching))]
    if all(setting is None for _, setting in found):
        return [
            f"--batching {batching.mode} has no Triton dynamic_batching or Ray Serve "
            "@serve.batch equivalent (it is the engine's own scheduler)"
        ]
    return [CAVEAT] + [f"  {name + ':':<23} {setting}" for name, setting in found if setting]


def for_tune(options: TuneOptions, best: str | None) -> list[str]:
    """The equivalents of the worker configuration ``gpuscope tune`` found best
    (``best`` is its label, ``flag=value``); none when no value won."""
    from gpuscope import flags
    from gpuscope.worker.config import WorkerConfig

    value = next((v for v in options.values() if options.label(v) == best), None)
    if value is None:
        return []
    # the worker's own parser: the swept value over --worker-args over the defaults
    argv = options.worker_argv(value, port=0, otlp=f"http://127.0.0.1:1{TRACES_PATH}")
    config = flags.parse(WorkerConfig, argv[1:], {}, exit_on_error=False)
    return lines(Batching(str(config.batching), config.max_batch_size, config.max_queue_delay_ms))
