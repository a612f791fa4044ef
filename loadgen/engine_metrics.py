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

vLLM (the v1 engine, 0.32.0) observes a histogram per phase for each finished request,
summed here over its ``model_name`` and ``engine`` labels:

=========================================  ============================================
vLLM histogram                             ``Snapshot`` field
=========================================  ============================================
``vllm:e2e_request_latency_seconds``       end-to-end; its count is ``requests``
``vllm:request_queue_time_seconds``        phase ``queue`` (WAITING: until scheduled)
``vllm:request_inference_time_seconds``    phase ``compute`` (RUNNING: scheduled to the
                                           last token, i.e. prefill + decode)
``vllm:request_{prefill,decode}_time_..``  not phases: compute's two stages, kept in
                                           ``VllmSnapshotBuilder.histograms``
``vllm:generation_tokens_total`` over       batch size: sequences per engine step
``vllm:iteration_tokens_total_count``
=========================================  ============================================

vLLM's spans and request histograms carry no batch size, but each engine step (one
scheduler iteration, counted by the ``vllm:iteration_tokens_total`` histogram) gives
each sequence it runs one new token (``vllm:generation_tokens_total``), so over a step
generated tokens / iterations is the mean number of sequences per engine step: vLLM's
running batch. It counts a sequence only in the steps that give it a token: a prompt
prefilled in chunks runs in steps that give none until its last chunk (the mean reads a
little low), and speculative decoding gives several a step (it reads high).

These are the same per-request times vLLM puts on its ``llm_request`` span
(``gen_ai.latency.time_in_queue`` and ``..time_in_model_inference``, which the exporter
turns into the phases ``queue`` and ``compute``), so over the same requests the exporter's
phase means and vLLM's delta sum / delta count must agree: ``agreement`` says how well.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Final, Protocol

from gpuscope.loadgen.server_view import (
    Histogram,
    MalformedMetrics,
    ServerStep,
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


VLLM_E2E: Final = "vllm:e2e_request_latency_seconds"
VLLM_QUEUE: Final = "vllm:request_queue_time_seconds"
VLLM_INFERENCE: Final = "vllm:request_inference_time_seconds"
VLLM_PREFILL: Final = "vllm:request_prefill_time_seconds"
VLLM_DECODE: Final = "vllm:request_decode_time_seconds"
_VLLM: Final = (VLLM_E2E, VLLM_QUEUE, VLLM_INFERENCE, VLLM_PREFILL, VLLM_DECODE)
# the two counts whose ratio is the mean batch: tokens generated, engine steps taken
VLLM_GENERATED: Final = "vllm:generation_tokens_total"
VLLM_ITERATIONS: Final = "vllm:iteration_tokens_total_count"
_SUFFIXES: Final = ("_bucket", "_sum", "_count")


class VllmSnapshotBuilder:
    """One scrape of vLLM's ``/metrics`` as a ``Snapshot``, a line at a time."""

    def __init__(self) -> None:
        self.histograms = {name: Histogram() for name in _VLLM}
        self.counts = {VLLM_GENERATED: 0.0, VLLM_ITERATIONS: 0.0}
        self._lines = 0

    def add(self, line: str) -> None:
        self._lines += 1
        line = line.strip()
        if not line.startswith("vllm:"):
            return  # comments, and the Python process's own families
        try:
            sample, labels, value = parse_sample(line)
            if sample in self.counts:
                if not math.isfinite(value) or value < 0:
                    raise MalformedMetrics(f"{sample} is {value}, not a count")
                self.counts[sample] += value
                return
            family, suffix = _family(sample)
            if family is None:
                return  # vLLM's other families (prompt tokens, cache, ...)
            if suffix != "_sum" and (not math.isfinite(value) or value < 0):
                raise MalformedMetrics(f"{sample} is {value}, not a count")
            histogram = self.histograms[family]
            if suffix == "_bucket":
                try:
                    le = float(labels["le"])
                except (KeyError, ValueError):
                    raise MalformedMetrics(f"{sample} without a numeric 'le'") from None
                histogram.buckets[le] = histogram.buckets.get(le, 0.0) + value
            elif suffix == "_sum":
                histogram.sum += value
            else:
                histogram.count += value
        except MalformedMetrics as exc:
            raise MalformedMetrics(f"line {self._lines}: {exc}") from None

    def finish(self, taken_s: float) -> Snapshot:
        h = self.histograms
        return Snapshot(
            taken_s,
            requests=h[VLLM_E2E].count,
            duration=h[VLLM_E2E],
            phases={"queue": h[VLLM_QUEUE], "compute": h[VLLM_INFERENCE]},
            batch_size=Histogram({}, self.counts[VLLM_GENERATED], self.counts[VLLM_ITERATIONS]),
        )


def _family(sample: str) -> tuple[str | None, str]:
    for suffix in _SUFFIXES:
        if sample.endswith(suffix) and sample.removesuffix(suffix) in _VLLM:
            return sample.removesuffix(suffix), suffix
    return None, ""


def vllm_stages(lines: Iterable[str]) -> dict[str, Histogram]:
    """vLLM's five request histograms of one scrape's text, by family name."""
    builder = VllmSnapshotBuilder()
    for line in lines:
        builder.add(line)
    return builder.histograms


def agreement(tuner: ServerStep, engine: ServerStep) -> dict[str, tuple[float, float, float]]:
    """Per phase both give: (the tuner's mean ms, the engine's, |difference| / the engine's)."""
    compared = {}
    for phase, ours in tuner.phase_mean_ms.items():
        theirs = engine.phase_mean_ms.get(phase)
        if theirs is None:
            continue
        diff = abs(ours - theirs) / theirs if theirs > 0 else (0.0 if ours == 0 else math.inf)
        compared[phase] = (ours, theirs, diff)
    return compared


# --server-metrics-format and --engine-metrics-format: whose /metrics a view reads.
BUILDERS: Final[dict[str, type[Builder]]] = {
    "exporter": SnapshotBuilder,
    "triton": TritonSnapshotBuilder,
    "vllm": VllmSnapshotBuilder,
}
ENGINE_FORMATS: Final = tuple(name for name in BUILDERS if name != "exporter")
