"""Text Generation Inference's own ``/metrics``: its row of ``ENGINES``."""

from __future__ import annotations

from pack.contract import phase
from pack.engines.base import (
    DURATION_HISTOGRAM,
    END_TO_END,
    ERRORS,
    PHASE_HISTOGRAM,
    PHASE_TIMES,
    Capability,
    Engine,
    EngineTiming,
    Exposition,
    Release,
    histogram_samples,
)

TGI = "tgi"

# Text Generation Inference: the router records per-request histograms in seconds
# (router/src/server.rs), all with the bounds of its duration matcher (every name
# ending in "duration": 0.0001 * 1.5^n, n = 1..35, written by metrics-exporter-prometheus
# 0.15.3 with Rust's shortest float formatting) and no labels; counters have no _total
# suffix; the backend (backends/v3/src/backend.rs, queue.rs) sets the batch and queue
# gauges. TGI's series name no model.
TGI_RELEASE = Release(
    "Text Generation Inference",
    "v3.3.7",
    "huggingface/text-generation-inference",
    "tag v3.3.7, commit dfb3fbe78e0d1d69251bd33065591c61bafdfaa8",
    (
        "router/src/server.rs",
        "router/src/infer/mod.rs",
        "backends/v3/src/backend.rs",
        "backends/v3/src/queue.rs",
    ),
)
_TGI_DURATION_BOUNDS = (
    "0.00015000000000000001", "0.00022500000000000002", "0.0003375", "0.00050625",
    "0.000759375", "0.0011390624999999999", "0.0017085937499999998",
    "0.0025628906249999996", "0.0038443359374999994", "0.00576650390625",
    "0.008649755859375", "0.0129746337890625", "0.01946195068359375",
    "0.029192926025390625", "0.043789389038085935", "0.0656840835571289",
    "0.09852612533569335", "0.14778918800354002", "0.22168378200531003",
    "0.33252567300796504", "0.49878850951194753", "0.7481827642679213",
    "1.122274146401882", "1.683411219602823", "2.5251168294042348", "3.787675244106352",
    "5.681512866159528", "8.52226929923929", "12.783403948858936", "19.175105923288406",
    "28.76265888493261", "43.143988327398915", "64.71598249109837", "97.07397373664756",
    "145.61096060497135",
)  # fmt: skip
# request start to the queue (parsing, validation, tokenising)
TGI_VALIDATION = "tgi_request_validation_duration"
TGI_QUEUE = "tgi_request_queue_duration"  # queued to the batch it starts in
TGI_INFERENCE = "tgi_request_inference_duration"  # that batch's start to the response
TGI_DURATION = "tgi_request_duration"  # the three together
# inference ÷ generated tokens (prefill included): TGI's time per token, not gpuscope's
# (first token to last ÷ tokens − 1)
TGI_TIME_PER_TOKEN = "tgi_request_mean_time_per_token_duration"
TGI_BATCH_INFERENCE = "tgi_batch_inference_duration"  # per batch forward, label method
TGI_SUCCESS = "tgi_request_success"
TGI_FAILURE = "tgi_request_failure"  # label err
TGI_QUEUE_SIZE = "tgi_queue_size"
TGI_BATCH_SIZE = "tgi_batch_current_size"
# generation (424) and incomplete (500) are the engine's failures; validation, template
# (422) and overloaded (429) are the client's or admission's, dropped a disconnect
TGI_ERRORS = 'err=~"generation|incomplete"'


def _tgi_timing(native: str, gpuscope: str, key_value: str = "") -> EngineTiming:
    return EngineTiming(
        gpuscope,
        key_value,
        (native + "_sum",),
        native + "_count",
        bucket=native + "_bucket",
        bounds=_TGI_DURATION_BOUNDS,
    )


TGI_ENGINE = Engine(
    source=TGI,
    name="TGI",
    prefix="tgi_",
    # no first-token histogram; its time per token is not gpuscope's TPOT
    reports=frozenset({PHASE_TIMES, END_TO_END, ERRORS}),
    release=TGI_RELEASE,
    job_selector='job="tgi"',
    model_label="",
    exposition={
        **{
            sample: shape
            for native in (TGI_VALIDATION, TGI_QUEUE, TGI_INFERENCE, TGI_DURATION)
            for sample, shape in histogram_samples(native, (), _TGI_DURATION_BOUNDS).items()
        },
        **histogram_samples(TGI_TIME_PER_TOKEN, (), _TGI_DURATION_BOUNDS),
        **histogram_samples(TGI_BATCH_INFERENCE, ("method",), _TGI_DURATION_BOUNDS),
        TGI_SUCCESS: Exposition("counter", ()),
        TGI_FAILURE: Exposition("counter", ("err",)),
        TGI_QUEUE_SIZE: Exposition("gauge", ()),
        TGI_BATCH_SIZE: Exposition("gauge", ()),
    },
    timings=(
        _tgi_timing(TGI_VALIDATION, PHASE_HISTOGRAM, phase("preprocess")),
        _tgi_timing(TGI_QUEUE, PHASE_HISTOGRAM, phase("queue")),
        _tgi_timing(TGI_INFERENCE, PHASE_HISTOGRAM, phase("compute")),
        _tgi_timing(TGI_DURATION, DURATION_HISTOGRAM),
    ),
    requests=(TGI_SUCCESS, TGI_FAILURE),
    errors=(TGI_FAILURE, TGI_ERRORS),
    running="",
    waiting=TGI_QUEUE_SIZE,
    kv_usage="",
    capability=Capability(
        phases=(phase("preprocess"), phase("queue"), phase("compute")),
        stages=(),
        ttft="",
        tpot="",
        batch_size="running batch: tgi_batch_current_size while a batch runs",
        kv_cache="",
        gpu_join="by pod (with dcgm-exporter: the one GPU the pod holds), else per host",
        quantiles="every phase and the request duration (buckets from 0.15 ms, ×1.5)",
    ),
)
