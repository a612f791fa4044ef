"""Where request timings come from, and how each engine's own ``/metrics`` map onto
gpuscope's: one module per engine (``vllm.py``, ``triton.py``, ``tgi.py``, ``sglang.py``,
``trtllm.py``), each holding its ``Engine`` row, over ``base.py`` (the ``Engine`` type and
what the rows share); this module lists the rows in ``ENGINES`` and derives from them
what the rest of the pack reads (sources, capabilities, the boards' notes).

One table for the recording rules (``alerts/recording.py`` imports it, as it does
``pcie.py``) and for what the boards say about each engine. A *source* is one path
the numbers take into Prometheus; the recording rules label every request-side
series with its source, so the same requests seen through two paths are never added
together:

- ``spans``: gpuscope's exporter, from spans (the middleware, the reference worker, or
  vLLM's ``llm_request`` span through the middleware bridge);
- ``vllm``: vLLM's own ``/metrics``, scraped by Prometheus; no gpuscope in the
  request path;
- ``triton``, ``tgi``, ``sglang``, ``trtllm``: Triton Inference Server's (with the
  TensorRT-LLM backend's own families where it serves one), Text Generation
  Inference's, SGLang's and ``trtllm-serve``'s own ``/metrics`` the same way
  (``ENGINES`` below, taken from each engine's source at the release it names).

An engine's own names (``TRITON_SUCCESS``, ``VLLM_RUNNING``, ...) live in its module;
those the builders and tests read are imported here too (``__all__``).
"""

from __future__ import annotations

from collections.abc import Sequence

from gpuscope.contract import exporter as exporter_rows
from pack.contract import COMPUTE_STAGES, PHASES, WORKER_INFO
from pack.engines.base import (
    BATCH_SIZE,
    BATCHING,
    CAPABILITIES,
    COMMON,
    COMPUTE_SPLIT,
    DURATION_HISTOGRAM,
    END_TO_END,
    ERRORS,
    FINISH_REASONS,
    GENERATION_LENGTH,
    GENERATION_TOKENS_HISTOGRAM,
    HISTOGRAM_KEY,
    PHASE_HISTOGRAM,
    PHASE_QUANTILES,
    PHASE_TIMES,
    PROMPT_LENGTH,
    PROMPT_TOKENS_HISTOGRAM,
    RECORDED_ONLY,
    REQUEST_HISTOGRAMS,
    SPANS,
    STAGE_HISTOGRAM,
    TIME_PER_OUTPUT_TOKEN,
    TIME_TO_FIRST_TOKEN,
    TOKEN_HISTOGRAMS,
    TPOT_HISTOGRAM,
    TTFT_HISTOGRAM,
    Capability,
    Engine,
    EngineTiming,
    Exposition,
    Release,
    SourceCapabilities,
)
from pack.engines.sglang import (
    SGLANG,
    SGLANG_E2E,
    SGLANG_ENGINE,
    SGLANG_QUEUE,
)
from pack.engines.tgi import (
    TGI,
    TGI_BATCH_SIZE,
    TGI_ENGINE,
)
from pack.engines.triton import (
    TRITON,
    TRITON_COMPUTE_US,
    TRITON_ENGINE,
    TRITON_EXECUTED_FAILURES,
    TRITON_EXECUTIONS,
    TRITON_FAILURE,
    TRITON_FIRST_RESPONSE_MS,
    TRITON_INFERENCES,
    TRITON_PENDING,
    TRITON_QUEUE_US,
    TRITON_REQUEST_US,
    TRITON_SUCCESS,
    TRTLLM_BACKEND_KV_BLOCKS,
    TRTLLM_BACKEND_REQUESTS,
)
from pack.engines.trtllm import (
    TRTLLM,
    TRTLLM_ENGINE,
)
from pack.engines.vllm import (
    VLLM,
    VLLM_ENGINE,
    VLLM_ERROR_REASON,
    VLLM_FINISHED,
    VLLM_HISTOGRAMS,
    VLLM_KV_USAGE,
    VLLM_PREEMPTIONS,
    VLLM_RUNNING,
    VLLM_TOKEN_HISTOGRAMS,
    VLLM_WAITING,
    EngineHistogram,
    vllm_histograms_for,
)

__all__ = [
    "BATCHING",
    "BATCH_SIZE",
    "CAPABILITIES",
    "COMMON",
    "COMPUTE_SPLIT",
    "DURATION_HISTOGRAM",
    "END_TO_END",
    "ENGINES",
    "ENGINE_PHASES",
    "ENGINE_STAGES",
    "ERRORS",
    "FINISH_REASONS",
    "GENERATION_LENGTH",
    "GENERATION_TOKENS_HISTOGRAM",
    "HISTOGRAM_KEY",
    "NO_TRAFFIC",
    "PHASE_HISTOGRAM",
    "PHASE_QUANTILES",
    "PHASE_TIMES",
    "PROMPT_LENGTH",
    "PROMPT_TOKENS_HISTOGRAM",
    "RECORDED_ONLY",
    "REQUEST_HISTOGRAMS",
    "ROW_RULED",
    "SCRAPED_ENGINE_SERIES",
    "SGLANG",
    "SGLANG_E2E",
    "SGLANG_ENGINE",
    "SGLANG_QUEUE",
    "SOURCES",
    "SOURCE_CAPABILITIES",
    "SOURCE_DETAILS",
    "SPANS",
    "STAGE_HISTOGRAM",
    "TGI",
    "TGI_BATCH_SIZE",
    "TGI_ENGINE",
    "TIME_PER_OUTPUT_TOKEN",
    "TIME_TO_FIRST_TOKEN",
    "TOKEN_HISTOGRAMS",
    "TPOT_HISTOGRAM",
    "TRITON",
    "TRITON_COMPUTE_US",
    "TRITON_ENGINE",
    "TRITON_EXECUTED_FAILURES",
    "TRITON_EXECUTIONS",
    "TRITON_FAILURE",
    "TRITON_FIRST_RESPONSE_MS",
    "TRITON_INFERENCES",
    "TRITON_PENDING",
    "TRITON_QUEUE_US",
    "TRITON_REQUEST_US",
    "TRITON_SUCCESS",
    "TRTLLM",
    "TRTLLM_BACKEND_KV_BLOCKS",
    "TRTLLM_BACKEND_REQUESTS",
    "TRTLLM_ENGINE",
    "TTFT_HISTOGRAM",
    "VLLM",
    "VLLM_ENGINE",
    "VLLM_ERROR_REASON",
    "VLLM_FINISHED",
    "VLLM_HISTOGRAMS",
    "VLLM_KV_USAGE",
    "VLLM_PREEMPTIONS",
    "VLLM_RUNNING",
    "VLLM_TOKEN_HISTOGRAMS",
    "VLLM_WAITING",
    "Capability",
    "Engine",
    "EngineHistogram",
    "EngineTiming",
    "Exposition",
    "Release",
    "SourceCapabilities",
    "capabilities_note",
    "engine_reports",
    "has_bound",
    "lacking_note",
    "missing_phases",
    "not_reported",
    "phases_note",
    "reported_by",
    "source_reports",
    "vllm_histograms_for",
]

# Every engine watched through its own /metrics, one row each: everything else of the
# pack that lists engines (sources, job selectors, build flags, rules, alerts, boards'
# variables and notes, the tests' parametrisations) derives from this tuple.
ENGINES = (VLLM_ENGINE, TRITON_ENGINE, TGI_ENGINE, SGLANG_ENGINE, TRTLLM_ENGINE)
# The engines whose rules alerts/engine_rules.py writes from their rows.
ROW_RULED = tuple(engine for engine in ENGINES if not engine.beside_spans)
SOURCES = (SPANS, *(engine.source for engine in ENGINES))

# What each source gives, in the words of docs/engines/README.md's table (a test compares
# them): phases, TTFT, TPOT, batch size, KV cache, GPU join (``reports`` says whether it
# does). ``spans`` is what gpuscope's spans can carry: the reference worker marks every
# phase; an application or engine behind the middleware gives what it marks.
SOURCE_DETAILS = {
    SPANS: Capability(
        phases=PHASES,
        stages=COMPUTE_STAGES,
        ttft="streams",
        tpot="streams",
        batch_size="gpuscope.batch spans",
        kv_cache="the worker's /metrics",
        gpu_join="by GPU UUID",
        quantiles="every timing, with exemplars",
    ),
    **{engine.source: engine.capability for engine in ENGINES},
}

# A series each serving engine's /metrics serves (the reference worker's, and each
# engine's ``scraped``): the boards list the scrape jobs and instances of engines from
# them.
SCRAPED_ENGINE_SERIES = tuple(
    dict.fromkeys([WORKER_INFO, *(name for engine in ENGINES for name in engine.scraped)])
)

# What each engine reports of gpuscope's phases, for the boards' notes.
ENGINE_PHASES = {
    "reference worker (spans)": PHASES,
    **{engine.phases_note: engine.capability.phases for engine in ENGINES},
}
ENGINE_STAGES = {
    "reference worker (spans)": (),
    **{engine.phases_note: engine.capability.stages for engine in ENGINES},
}


SOURCE_CAPABILITIES = {
    # no per-request token histograms and no finish reasons: spans give token counts
    # (gpuscope_tokens_total) and no finish reason as a metric label
    # (the reference worker batches and reports compute whole; vLLM's span splits
    # compute and has no batch of its own)
    SPANS: SourceCapabilities(COMMON, frozenset({COMPUTE_SPLIT, BATCH_SIZE, BATCHING})),
    **{engine.source: SourceCapabilities(engine.reports, engine.sometimes) for engine in ENGINES},
}
NO_TRAFFIC = "No traffic"


def engine_reports(source: str) -> frozenset[str]:
    """What the ``ENGINES`` row of ``source`` says it gives beyond its hand-written
    ``reports``: a mean batch size where its capability
    names one, phase quantiles where every phase it maps has buckets."""
    found: set[str] = set()
    for engine in ENGINES:
        if engine.source != source:
            continue
        if engine.capability.reports("batch_size"):
            found.add(BATCH_SIZE)
        phases = engine.timings_for(PHASE_HISTOGRAM)
        if phases and all(timing.bucket for timing in phases):
            found.add(PHASE_QUANTILES)
    return frozenset(found)


def source_reports(source: str) -> frozenset[str]:
    """Every capability every engine behind ``source`` gives."""
    return SOURCE_CAPABILITIES[source].reports | engine_reports(source)


def reported_by(capability: str, source: str) -> bool:
    """Whether every engine behind ``source`` reports ``capability``."""
    if capability not in CAPABILITIES:
        raise LookupError(f"the boards name capability {capability!r}, not in {CAPABILITIES}")
    return capability in source_reports(source)


def lacking_note(lacking: Sequence[str]) -> str:
    """A panel's text when it has no data: "No traffic" where no source lacks what it
    shows, else that this engine may not report it, naming the ``lacking`` sources."""
    if not lacking:
        return NO_TRAFFIC
    return f"Not reported by this engine ({', '.join(lacking)}), or no traffic"


def not_reported(capability: str, sources: tuple[str, ...] = SOURCES) -> str:
    """What a panel over ``capability`` says when it has no data: "No traffic" where
    every one of ``sources`` reports it, else that this engine may not report it,
    naming the sources that do not (or not always)."""
    return lacking_note([source for source in sources if not reported_by(capability, source)])


_SPANS_HISTOGRAMS = {
    row.name: row
    for row in (
        exporter_rows.REQUEST_DURATION,
        exporter_rows.REQUEST_PHASE,
        exporter_rows.REQUEST_COMPUTE_STAGE,
        exporter_rows.TIME_TO_FIRST_TOKEN,
        exporter_rows.TIME_PER_OUTPUT_TOKEN,
    )
}


def has_bound(source: str, histogram: str, seconds: float) -> bool:
    """Whether ``source`` records ``histogram`` with a bucket bound at ``seconds``: the
    share of requests within it (an objective's) is then exact; the rules record no
    share for a bound between two buckets, or without buckets."""
    if source == SPANS:
        return seconds in _SPANS_HISTOGRAMS[histogram].buckets
    return any(
        seconds in timing.seconds
        for engine in ENGINES
        if engine.source == source
        for timing in engine.timings_for(histogram)
    )


def capabilities_note() -> str:
    """Markdown: what each source reports, from the table."""
    lines = []
    for source, row in SOURCE_CAPABILITIES.items():
        reports = source_reports(source)
        sometimes = [c for c in CAPABILITIES if c in row.sometimes - reports]
        lacking = [c for c in CAPABILITIES if c not in reports | row.sometimes]
        lines.append(
            f"- `{source}`: {', '.join(c for c in CAPABILITIES if c in reports)}"
            + (f"; by some engines: {', '.join(sometimes)}" if sometimes else "")
            + (f"; not reported: {', '.join(lacking)}" if lacking else "")
        )
    return "\n".join(lines)


def missing_phases(engine: str) -> tuple[str, ...]:
    return tuple(p for p in PHASES if p not in ENGINE_PHASES[engine])


def phases_note() -> str:
    """Markdown for the boards: the sources, and which phases each engine reports."""
    lines = [
        "Request timings per **source**: `spans` (gpuscope's exporter: the middleware, "
        "the reference worker, or vLLM's `llm_request` span), or an engine's own "
        "`/metrics` with no gpuscope in the request path: "
        + ", ".join(f"`{engine.source}`" for engine in ENGINES)
        + ". Panels over the recording rules "
        "show one source at a time, so the same requests seen both ways are never "
        "added up. A phase an engine does not report is absent, never zero:",
        "",
    ]
    for engine, phases in ENGINE_PHASES.items():
        stages = ENGINE_STAGES[engine]
        missing = missing_phases(engine)
        lines.append(
            f"- {engine}: {', '.join(phases)}"
            + (f"; compute split into {' and '.join(stages)}" if stages else "")
            + (f"; no {', '.join(missing)}" if missing else "")
        )
    lines += ["", "What each source reports (a panel it lacks says so):", capabilities_note()]
    lines += [
        "",
        "Requests seen through an engine's own `/metrics` name no GPU: they are judged "
        "against every GPU of their host (GPU `all`).",
    ]
    return "\n".join(lines)
