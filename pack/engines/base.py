"""The ``Engine`` row and what every engine's module shares: the gpuscope request
histograms an engine's timings stand for, the ``Release`` its names were read from, the
``Exposition`` of each sample, the ``EngineTiming`` and ``Capability`` types, the
capabilities the boards name, and ``histogram_samples``. Each engine is one module of
this package (``vllm.py``, ``triton.py``, ``tgi.py``, ``sglang.py``, ``trtllm.py``);
``__init__.py`` lists them in ``ENGINES`` and derives the rest from the rows.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuscope.contract import exporter as exporter_rows
from pack.contract import COMPUTE_STAGES, PHASE, PHASES, STAGE

# gpuscope's exporter, from spans: the source that is no engine's own /metrics
SPANS = "spans"

PHASE_HISTOGRAM = exporter_rows.REQUEST_PHASE.name
STAGE_HISTOGRAM = exporter_rows.REQUEST_COMPUTE_STAGE.name
DURATION_HISTOGRAM = exporter_rows.REQUEST_DURATION.name
TTFT_HISTOGRAM = exporter_rows.TIME_TO_FIRST_TOKEN.name
TPOT_HISTOGRAM = exporter_rows.TIME_PER_OUTPUT_TOKEN.name
# The request histograms recorded per source (service_model_gpu level).
REQUEST_HISTOGRAMS = (
    PHASE_HISTOGRAM,
    STAGE_HISTOGRAM,
    DURATION_HISTOGRAM,
    TTFT_HISTOGRAM,
    TPOT_HISTOGRAM,
)
# The label that tells a histogram's series apart, where it has one.
HISTOGRAM_KEY = {PHASE_HISTOGRAM: PHASE, STAGE_HISTOGRAM: STAGE}

# Per request, the tokens of its prompt and of its generation: histograms gpuscope's
# exporter does not serve (its spans give token counts, summed in gpuscope_tokens_total),
# recorded per source from the engines that do, under these names.
PROMPT_TOKENS_HISTOGRAM = "gpuscope_request_prompt_tokens"
GENERATION_TOKENS_HISTOGRAM = "gpuscope_request_generation_tokens"
TOKEN_HISTOGRAMS = (PROMPT_TOKENS_HISTOGRAM, GENERATION_TOKENS_HISTOGRAM)
RECORDED_ONLY = TOKEN_HISTOGRAMS

# Each engine's module takes every name, type, unit, label and bucket from the
# engine's source at the release its ``Release`` names (read there, not from docs or
# examples), and the promtool cases of alerts/tests/<engine>_test.yml feed series of
# exactly that shape (tests/alerts/test_alerts_engines.py checks them against
# ``Exposition``).


@dataclass(frozen=True)
class Release:
    """Where an engine's metric names were read: its release and the files."""

    engine: str
    version: str
    repository: str
    ref: str  # the tag (or release branch) and its commit
    files: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.engine} {self.version}"


@dataclass(frozen=True)
class Exposition:
    """One sample name as the engine exposes it: its type, label names, bucket bounds."""

    type: str  # counter, gauge, histogram (the _bucket sample), summary
    labels: tuple[str, ...]  # always present (besides job and instance)
    optional: tuple[str, ...] = ()  # present in some deployments only
    bounds: tuple[str, ...] = ()  # finite ``le`` values as the engine writes them


@dataclass(frozen=True)
class EngineTiming:
    """An engine's measurement standing for one gpuscope histogram (and phase or stage).

    ``sums`` are native samples whose rates add up to the rate of the histogram's
    ``_sum`` (in the engine's unit, ``per_second`` of them a second); ``minus_sums`` are
    taken off it (SGLang's compute: end to end minus queue). ``count`` is the native
    sample counting the requests measured. ``bucket`` and ``bounds``, where the
    engine has a histogram, give quantiles; ``bounds`` are its ``le`` as written, and
    ``seconds`` the same bounds in seconds."""

    gpuscope: str
    key_value: str  # the phase or stage it is; "" for histograms without a key
    sums: tuple[str, ...]
    count: str
    per_second: float = 1.0  # native units in a second: 1e6 for µs, 1e3 for ms
    minus_sums: tuple[str, ...] = ()
    bucket: str = ""
    bounds: tuple[str, ...] = ()

    @property
    def seconds(self) -> tuple[float, ...]:
        return tuple(float(bound) / self.per_second for bound in self.bounds)


@dataclass(frozen=True)
class Capability:
    """What one source gives the boards: the phases and compute stages, TTFT and TPOT,
    the batch size, the KV cache and how requests are joined to their GPU. A note says
    how, or why not (``""``: not reported by this engine)."""

    phases: tuple[str, ...]
    stages: tuple[str, ...]
    ttft: str
    tpot: str
    batch_size: str
    kv_cache: str
    gpu_join: str
    quantiles: str  # which of the request timings have quantiles (P99), and why not

    def reports(self, what: str) -> bool:
        """Whether the source gives ``what``: a phase, a stage, or one of ``ttft``,
        ``tpot``, ``batch_size``, ``kv_cache``, ``gpu_join``."""
        if what in PHASES:
            return what in self.phases
        if what in COMPUTE_STAGES:
            return what in self.stages
        return bool(getattr(self, what))


# What a source can report: the boards read it (``SOURCE_CAPABILITIES``, from each
# engine's row) so that a panel over something a source lacks says "not reported by this
# engine" instead of drawing nothing. ``reports`` holds what every engine behind the
# source gives; ``sometimes`` what only some do (spans: the reference worker reports
# compute whole, vLLM's span splits it into prefill and decode).
PHASE_TIMES = "phase times"
# P99s of the phases: an engine whose phases are counters (means) has none
PHASE_QUANTILES = "phase quantiles"
COMPUTE_SPLIT = "prefill and decode"
# gpuscope's batch spans: the batch-size histogram, triggers and the batch-wait phase
BATCHING = "batch wait and batch-size distribution"
# the recorded mean batch size of an engine's own counters or gauges
BATCH_SIZE = "mean batch size"
END_TO_END = "end-to-end latency"
TIME_TO_FIRST_TOKEN = "time to first token"
TIME_PER_OUTPUT_TOKEN = "time per output token"
PROMPT_LENGTH = "prompt length"
GENERATION_LENGTH = "generation length"
FINISH_REASONS = "finish reasons"
ERRORS = "server errors"
CAPABILITIES = (
    PHASE_TIMES,
    PHASE_QUANTILES,
    COMPUTE_SPLIT,
    BATCH_SIZE,
    BATCHING,
    END_TO_END,
    TIME_TO_FIRST_TOKEN,
    TIME_PER_OUTPUT_TOKEN,
    PROMPT_LENGTH,
    GENERATION_LENGTH,
    FINISH_REASONS,
    ERRORS,
)
COMMON = frozenset(
    {PHASE_TIMES, PHASE_QUANTILES, END_TO_END, TIME_TO_FIRST_TOKEN, TIME_PER_OUTPUT_TOKEN, ERRORS}
)


@dataclass(frozen=True)
class SourceCapabilities:
    reports: frozenset[str]
    sometimes: frozenset[str] = frozenset()


NOT_REPORTED = "not reported by this engine"


@dataclass(frozen=True)
class Engine:
    """One engine's ``/metrics`` mapped onto the series the boards and the verdict read.

    One row is the whole of an engine: its job selector (and ``alerts/build.py``'s
    ``--<source>-job-selector``), its rules, the "engine metrics down" alert, the boards'
    variables and notes all follow ``ENGINES``."""

    source: str  # the ``source`` label of its recorded series; its default job name too
    name: str  # as the docs and the rule files' comments name it ("Triton")
    release: Release
    job_selector: str  # its scrape job, by default
    model_label: str  # the engine's label naming the model; "" when it has none
    exposition: dict[str, Exposition]
    timings: tuple[EngineTiming, ...]
    requests: tuple[str, ...]  # counters that add up to every request the engine finished
    errors: tuple[str, str]  # (counter, matcher): the finished requests that failed
    # gauges per scrape target, each a name with an optional matcher
    # (``name{label="value"}``); "" when the engine has none
    running: str
    waiting: str
    kv_usage: str  # 0-1
    capability: Capability
    # what the boards show of it (CAPABILITIES), beyond what ``engine_reports`` finds in
    # the row itself: every engine of the source gives ``reports``, some ``sometimes``
    reports: frozenset[str]
    prefix: str  # every native name it exposes starts with this ("nv_", "vllm:")
    sometimes: frozenset[str] = frozenset()
    # what its queue holds, as the worker's ``endpoint`` label: a generation engine's
    # requests all hold KV-cache blocks (the worker's "completions")
    endpoint: str = "completions"
    # series its /metrics serves from the start, by which the boards list its scrape
    # jobs and instances; by default its request counters and state gauges
    served: tuple[str, ...] = ()
    # how the boards' phase notes name it; by default its release and "(/metrics)"
    note: str = ""
    # its rules are alerts/recording.py's, beside the spans' and the reference worker's
    # (vLLM: its state stands for the worker's in the same records, which the KV-cache
    # alerts and the worker's down alert read); otherwise alerts/engine_rules.py writes
    # them from the row, into engines.yml and the head of the bottleneck group
    beside_spans: bool = False
    page: str = ""  # its page in docs/engines/, when not named after the source
    # where families served beside the engine's own were read (a backend's)
    also: tuple[Release, ...] = ()

    @property
    def doc_page(self) -> str:
        return self.page or f"{self.source}.md"

    @property
    def scraped(self) -> tuple[str, ...]:
        """The names (matchers dropped) by which the boards list its targets."""
        names = self.served or (*self.requests, self.waiting, self.running)
        # a state gauge may carry a matcher (name{label="value"}): its name only
        return tuple(name.partition("{")[0] for name in names if name)

    @property
    def phases_note(self) -> str:
        return self.note or f"{self.release} (/metrics)"

    def timings_for(self, gpuscope: str) -> tuple[EngineTiming, ...]:
        return tuple(t for t in self.timings if t.gpuscope == gpuscope)


def histogram_samples(
    native: str, labels: tuple[str, ...], bounds: tuple[str, ...]
) -> dict[str, Exposition]:
    return {
        native + "_bucket": Exposition("histogram", (*labels, "le"), bounds=bounds),
        native + "_sum": Exposition("counter", labels),
        native + "_count": Exposition("counter", labels),
    }
