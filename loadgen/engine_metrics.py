"""An engine's own ``/metrics`` read as the exporter's view of a step, free of I/O.

Triton Inference Server exports no spans the exporter reads, but its Prometheus counters
(the ``nv_inference_*`` families on its metrics port) hold what a step's server-side
view needs, summed over every model and version:

================================================  =======================================
Triton counter                                    ``Snapshot`` field
================================================  =======================================
``nv_inference_request_success`` + ``_failure``   ``requests`` (what ``settle`` waits for)
``nv_inference_queue_duration_us``                phase ``queue`` (sum), over the successes
``nv_inference_compute_{input,infer,output}_..``  phase ``compute`` (sum), over the successes
``nv_inference_request_duration_us``              end-to-end (sum), over the successes
``nv_inference_count`` / ``_exec_count``          batch size: inferences per execution
================================================  =======================================

Triton's queue holds the dynamic batcher's wait (``max_queue_delay_microseconds``):
it has no separate batch-wait counter, so that wait shows as ``queue``. The duration
counters count successful requests only, and ``nv_inference_count`` successful
inferences while ``nv_inference_exec_count`` counts failed executions too: under
failures the mean batch reads low. These are counters, not histograms (release 2.51
has no latency histograms but the first response's), so a Triton step has phase means
and shares but no P99 split.
"""

from __future__ import annotations

import math
from typing import Final, Protocol

from gpuscope.loadgen.server_view import (
    Histogram,
    MalformedMetrics,
    Snapshot,
    SnapshotBuilder,
    parse_sample,
)

TRITON_SUCCESS: Final = "nv_inference_request_success"
TRITON_FAILURE: Final = "nv_inference_request_failure"
TRITON_QUEUE_US: Final = "nv_inference_queue_duration_us"
TRITON_COMPUTE_US: Final = (
    "nv_inference_compute_input_duration_us",
    "nv_inference_compute_infer_duration_us",
    "nv_inference_compute_output_duration_us",
)
TRITON_REQUEST_US: Final = "nv_inference_request_duration_us"
TRITON_INFERENCES: Final = "nv_inference_count"
TRITON_EXECUTIONS: Final = "nv_inference_exec_count"
_TRITON: Final = (
    TRITON_SUCCESS,
    TRITON_FAILURE,
    TRITON_QUEUE_US,
    *TRITON_COMPUTE_US,
    TRITON_REQUEST_US,
    TRITON_INFERENCES,
    TRITON_EXECUTIONS,
)


class Builder(Protocol):
    def add(self, line: str) -> None: ...

    def finish(self, taken_s: float) -> Snapshot: ...


class TritonSnapshotBuilder:
    """One scrape of Triton's metrics port as a ``Snapshot``, a line at a time."""

    def __init__(self) -> None:
        self.totals = dict.fromkeys(_TRITON, 0.0)
        self._lines = 0

    def add(self, line: str) -> None:
        self._lines += 1
        line = line.strip()
        if not line or line.startswith("#"):
            return
        try:
            sample, _, value = parse_sample(line)  # Triton's exposition is a few kB
            if sample not in self.totals:
                return  # the GPU, cache and pending-count families: not read
            if not math.isfinite(value) or value < 0:
                raise MalformedMetrics(f"{sample} is {value}, not a count")
        except MalformedMetrics as exc:
            raise MalformedMetrics(f"line {self._lines}: {exc}") from None
        self.totals[sample] += value

    def finish(self, taken_s: float) -> Snapshot:
        t = self.totals
        successes = t[TRITON_SUCCESS]
        compute_us = sum(t[name] for name in TRITON_COMPUTE_US)
        return Snapshot(
            taken_s,
            requests=successes + t[TRITON_FAILURE],
            duration=Histogram({}, t[TRITON_REQUEST_US] / 1e6, successes),
            phases={
                "queue": Histogram({}, t[TRITON_QUEUE_US] / 1e6, successes),
                "compute": Histogram({}, compute_us / 1e6, successes),
            },
            batch_size=Histogram({}, t[TRITON_INFERENCES], t[TRITON_EXECUTIONS]),
        )


# --server-metrics-format: whose /metrics the server-side view reads.
BUILDERS: Final[dict[str, type[Builder]]] = {
    "exporter": SnapshotBuilder,
    "triton": TritonSnapshotBuilder,
}
