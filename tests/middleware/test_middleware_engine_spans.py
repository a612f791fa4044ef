"""Engine request spans read as gpuscope phases (``gpuscope.engine_spans``), and the
model and operation read from an OpenAI-shaped response (``response_fields``).

The attributes are the ones a real vLLM sent (tests/fixtures/vllm-*/, captured by
``make vllm-check``), never hand-written ones.
"""

from __future__ import annotations

import math

import pytest

from gpuscope import engine_spans
from gpuscope.middleware import response_fields
from support.vllm_fixtures import llm_request_attributes


def test_every_captured_vllm_span_reads_as_queue_and_compute_split_into_prefill_and_decode() -> (
    None
):
    captured = llm_request_attributes()
    assert len(captured) >= 10
    for attributes in captured:
        report = engine_spans.read_engine_span(attributes)
        assert set(report.phases) == {"queue", "compute"}  # no batch_wait: continuous batching
        assert set(report.stages) == {"prefill", "decode"}
        assert report.phases["queue"] == attributes["gen_ai.latency.time_in_queue"]
        # vLLM computes inference as last token - scheduled, the stages from the first token
        assert report.stages["prefill"] + report.stages["decode"] == pytest.approx(
            report.phases["compute"], abs=1e-6
        )
        assert report.input_tokens == attributes["gen_ai.usage.prompt_tokens"]
        assert report.output_tokens == attributes["gen_ai.usage.completion_tokens"]
        assert report.time_to_first_token == attributes["gen_ai.latency.time_to_first_token"]
        if report.output_tokens is not None and report.output_tokens > 1:
            assert report.time_per_output_token == pytest.approx(
                report.stages["decode"] / (report.output_tokens - 1)
            )
        assert report.model is None  # vLLM's span names no model


def test_inference_is_prefill_plus_decode_where_an_engine_omits_it() -> None:
    attributes = dict(llm_request_attributes()[0])
    del attributes[engine_spans.VLLM_INFERENCE]
    report = engine_spans.read_engine_span(attributes)
    assert report.phases["compute"] == pytest.approx(
        attributes[engine_spans.VLLM_PREFILL] + attributes[engine_spans.VLLM_DECODE]
    )


def test_a_phase_the_engine_does_not_report_stays_absent() -> None:
    attributes = dict(llm_request_attributes()[0])
    del attributes[engine_spans.VLLM_QUEUE]
    del attributes[engine_spans.VLLM_COMPLETION_TOKENS]
    report = engine_spans.read_engine_span(attributes)
    assert "queue" not in report.phases
    assert report.output_tokens is None and report.time_per_output_token is None


@pytest.mark.parametrize(
    ("key", "value"),
    [
        (engine_spans.VLLM_QUEUE, -0.5),
        (engine_spans.VLLM_QUEUE, math.nan),
        (engine_spans.VLLM_DECODE, math.inf),
        (engine_spans.VLLM_TTFT, "0.1"),
        (engine_spans.VLLM_PREFILL, True),
        (engine_spans.VLLM_PROMPT_TOKENS, -3),
        (engine_spans.VLLM_COMPLETION_TOKENS, 2.5),
    ],
)
def test_bad_values_are_refused_with_the_key(key: str, value: object) -> None:
    attributes = dict(llm_request_attributes()[0]) | {key: value}
    with pytest.raises(engine_spans.EngineSpanInvalid, match=key.replace(".", r"\.")):
        engine_spans.read_engine_span(attributes)


@pytest.mark.parametrize(
    ("body", "model", "operation"),
    [
        (
            b'{"id":"cmpl-1","object":"text_completion","created":1,"model":"tiny","choices":[]}',
            "tiny",
            "text_completion",
        ),
        (
            b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"org/m-7b",',
            "org/m-7b",
            "chat",
        ),
        (b'{"object": "list", "model": "emb", "data": []}', "emb", None),  # route unknown
        (b'{"object":"error","message":"bad"}', None, None),
        (b'{"model":"a\\"b"}', None, None),  # escaped quote: not read, never mis-read
        (b'{"model":"' + b"x" * 200 + b'"}', None, None),  # over the label length
        (b"x" * 2000 + b'"model":"late"', None, None),  # beyond the sniffed prefix
        (b"\x00\xff garbage", None, None),
    ],
)
def test_model_and_operation_from_the_response_start(
    body: bytes, model: str | None, operation: str | None
) -> None:
    assert response_fields.model_and_operation(body) == (model, operation)


def test_only_json_and_event_streams_are_read() -> None:
    assert response_fields.sniffable([(b"content-type", b"application/json")])
    assert response_fields.sniffable([(b"Content-Type", b"text/event-stream; charset=utf-8")])
    assert not response_fields.sniffable([(b"content-type", b"text/plain")])
    assert not response_fields.sniffable([])
    assert not response_fields.sniffable(None)
    assert not response_fields.sniffable([(b"content-type",)])


def test_the_response_id_is_read_with_the_model() -> None:
    body = b'{"id":"chatcmpl-a232ecf9c042fa57","object":"chat.completion","model":"tiny"}'
    assert response_fields.read(body) == ("tiny", "chat", "chatcmpl-a232ecf9c042fa57")
    assert response_fields.read(b'{"id":"<script>"}').response_id is None
