"""Request spans that serving engines emit themselves, read as gpuscope phases.

An engine with its own tracing (vLLM's ``llm_request`` span) already measures what
gpuscope's phase marks would: how long each request waited for the scheduler and how
long the model worked on it. This module is the one place that knows those spans:
which span is an engine's request span, which of its attributes carry which phase,
and what a phase the engine does not measure becomes (absent, never zero). Both the
middleware (which folds an engine span into its own server span, in-process) and the
exporter (which reads an engine span that arrives alone) call ``read_engine_span``.

Mapping for vLLM (checked against the running engine, see docs/engines/vllm.md):

================================  ==========================================
vLLM attribute                    gpuscope
================================  ==========================================
``gen_ai.latency.time_in_queue``  phase ``queue`` (waiting for the scheduler)
``..time_in_model_inference``     phase ``compute`` (first schedule to last token)
``..time_in_model_prefill``       compute stage ``prefill``
``..time_in_model_decode``        compute stage ``decode``
``..time_to_first_token``         time to first token
decode / (output tokens - 1)      time per output token
``gen_ai.usage.prompt_tokens``    input tokens
``gen_ai.usage.completion_tokens``  output tokens
================================  ==========================================

A continuous-batching engine has no batch-wait: a request joins the running batch at
the next iteration, so ``batch_wait`` stays absent for it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from gpuscope import spans

# The attribute the middleware sets on an engine span whose request a gpuscope server
# span in the same process counts: the exporter then counts nothing from it.
COUNTED_BY_SERVER_SPAN: Final = "gpuscope.request.counted"

VLLM_REQUEST_SPAN: Final = "llm_request"
VLLM_QUEUE: Final = "gen_ai.latency.time_in_queue"
VLLM_PREFILL: Final = "gen_ai.latency.time_in_model_prefill"
VLLM_DECODE: Final = "gen_ai.latency.time_in_model_decode"
VLLM_INFERENCE: Final = "gen_ai.latency.time_in_model_inference"
VLLM_TTFT: Final = "gen_ai.latency.time_to_first_token"
VLLM_E2E: Final = "gen_ai.latency.e2e"
VLLM_PROMPT_TOKENS: Final = "gen_ai.usage.prompt_tokens"
VLLM_COMPLETION_TOKENS: Final = "gen_ai.usage.completion_tokens"
VLLM_RESPONSE_MODEL: Final = "gen_ai.response.model"

# Span names that are an engine's one span per request (all SERVER spans).
ENGINE_REQUEST_SPANS: Final = frozenset({VLLM_REQUEST_SPAN})

# Every attribute ``read_engine_span`` looks at, with the type it must have.
SECONDS_ATTRIBUTES: Final = (
    VLLM_QUEUE,
    VLLM_PREFILL,
    VLLM_DECODE,
    VLLM_INFERENCE,
    VLLM_TTFT,
    VLLM_E2E,
)
COUNT_ATTRIBUTES: Final = (VLLM_PROMPT_TOKENS, VLLM_COMPLETION_TOKENS)
TEXT_ATTRIBUTES: Final = (spans.GEN_AI_REQUEST_MODEL, VLLM_RESPONSE_MODEL)


class EngineSpanInvalid(ValueError):
    """An engine span attribute that is not a finite number in its range, or durations
    that contradict each other.

    ``is_duration`` tells a bad duration from another bad value (a token count);
    ``inconsistent`` marks values each valid alone that cannot all be true (a time to
    first token after the request ended, stages longer than the compute they split).
    """

    def __init__(self, message: str, *, is_duration: bool, inconsistent: bool = False) -> None:
        super().__init__(message)
        self.is_duration = is_duration
        self.inconsistent = inconsistent


@dataclass(frozen=True, slots=True)
class EngineReport:
    """What one engine request span says, in gpuscope's vocabulary (seconds)."""

    phases: Mapping[str, float]
    stages: Mapping[str, float]
    time_to_first_token: float | None = None
    time_per_output_token: float | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    model: str | None = None


def is_engine_request_span(name: str) -> bool:
    return name in ENGINE_REQUEST_SPANS


def read_engine_span(
    attributes: Mapping[str, object], span_seconds: float | None = None
) -> EngineReport:
    """The phases of an engine request span; raises ``EngineSpanInvalid`` on bad values.

    ``attributes`` may hold more keys than these; only the ones above are read.
    ``span_seconds``, the span's own duration where the caller knows it, bounds the
    durations it holds too.
    """
    queue = _seconds(attributes, VLLM_QUEUE)
    prefill = _seconds(attributes, VLLM_PREFILL)
    decode = _seconds(attributes, VLLM_DECODE)
    inference = _seconds(attributes, VLLM_INFERENCE)
    ttft = _seconds(attributes, VLLM_TTFT)
    e2e = _seconds(attributes, VLLM_E2E)
    if inference is None and prefill is not None and decode is not None:
        inference = prefill + decode
    _check_consistent(queue, prefill, decode, inference, ttft, e2e, span_seconds)
    phases = _present(queue=queue, compute=inference)
    stages = _present(prefill=prefill, decode=decode)
    tokens_in = _count(attributes, VLLM_PROMPT_TOKENS)
    tokens_out = _count(attributes, VLLM_COMPLETION_TOKENS)
    tpot = None
    if decode is not None and tokens_out is not None and tokens_out > 1:
        tpot = decode / (tokens_out - 1)
    model = _text(attributes, spans.GEN_AI_REQUEST_MODEL) or _text(attributes, VLLM_RESPONSE_MODEL)
    return EngineReport(
        phases=phases,
        stages=stages,
        time_to_first_token=ttft,
        time_per_output_token=tpot,
        input_tokens=tokens_in,
        output_tokens=tokens_out,
        model=model,
    )


def _check_consistent(
    queue: float | None,
    prefill: float | None,
    decode: float | None,
    inference: float | None,
    ttft: float | None,
    e2e: float | None,
    span_seconds: float | None,
) -> None:
    """Each part at most what holds it (``spans.DURATION_SLACK_S`` of slack): the stages
    within inference, queue + inference and TTFT within end to end and within the span,
    and the stages there too, the pair or either alone (a lone decode of 5,000 s on a
    1 s span was counted, and the time per output token drawn from it)."""
    present_stages = [seconds for seconds in (prefill, decode) if seconds is not None]
    stages = sum(present_stages) if present_stages else None
    in_phases = [seconds for seconds in (queue, inference) if seconds is not None]
    phases = sum(in_phases) if in_phases else None
    parts = (
        ("prefill + decode", stages, "inference", inference),
        ("queue + inference", phases, "end to end", e2e),
        ("time to first token", ttft, "end to end", e2e),
        ("end to end", e2e, "the span", span_seconds),
        ("queue + inference", phases, "the span", span_seconds),
        ("time to first token", ttft, "the span", span_seconds),
        ("prefill + decode", stages, "end to end", e2e),
        ("prefill + decode", stages, "the span", span_seconds),
    )
    for part_name, part, whole_name, whole in parts:
        if part is not None and whole is not None and part > whole + spans.DURATION_SLACK_S:
            raise EngineSpanInvalid(
                f"{part_name} ({part:g} s) is longer than {whole_name} ({whole:g} s)",
                is_duration=True,
                inconsistent=True,
            )


def _present(**values: float | None) -> dict[str, float]:
    return {name: value for name, value in values.items() if value is not None}


def _seconds(attributes: Mapping[str, object], key: str) -> float | None:
    value = attributes.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise EngineSpanInvalid(
            f"{key} must be a number of seconds, got {type(value).__name__}", is_duration=True
        )
    seconds = float(value)
    if not 0.0 <= seconds <= spans.MAX_DURATION_S:  # NaN, negatives, infinity, the absurd
        raise EngineSpanInvalid(
            f"{key} is {seconds}, not a duration in 0-{spans.MAX_DURATION_S:g} s",
            is_duration=True,
        )
    return seconds


def _count(attributes: Mapping[str, object], key: str) -> int | None:
    value = attributes.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise EngineSpanInvalid(
            f"{key} must be an integer, got {type(value).__name__}", is_duration=False
        )
    if not 0 <= value <= spans.MAX_COUNT:
        raise EngineSpanInvalid(
            f"{key} is {value}, not a count in 0-{spans.MAX_COUNT}", is_duration=False
        )
    return value


def _text(attributes: Mapping[str, object], key: str) -> str | None:
    value = attributes.get(key)
    return value if isinstance(value, str) and value else None
