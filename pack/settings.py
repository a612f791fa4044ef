"""The one table of the generated rules: every threshold, selector, window and ``for:``.

``alerts/build.py`` writes the rule files from a ``Settings``; its flags override a few
fields for fast test variants.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuscope.contract import exporter as exporter_rows
from pack import engines
from pack.contract import GPU_INDEX, MODEL, SERVICE, UUID

# The labels of service_model_gpu:* series: the source the numbers came through (see
# pack/engines.py), then what the request ran on. ``host`` is the scrape
# target's host (its ``instance`` without the port): the GPU join of requests that
# name no GPU (``gpu`` and ``uuid`` empty).
SERVICE_MODEL = f"{SERVICE}, {MODEL}"
GPU = f"{GPU_INDEX}, {UUID}"
REQUEST = f"{SERVICE_MODEL}, host, {GPU}"
SMG = "source, " + REQUEST
HOST_GPU = "host, " + GPU
# The runbook as shipped, from the repository root: the default of ``Settings.runbook``.
RUNBOOK_PATH = "alerts/runbook.md"
# The environment twin of alerts/build.py's --runbook-url (deploy/kubernetes/build.py
# reads it too).
RUNBOOK_URL_VARIABLE = "GPUSCOPE_RUNBOOK_URL"
# Clock event reasons that mean the hardware holds clocks down (not idle, not a setting).
THROTTLE_REASONS = (
    "hw_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
    "sw_thermal_slowdown",
    "sw_power_cap",
)


@dataclass(frozen=True)
class Slo:
    """A latency objective over a histogram: ``objective`` of requests within ``le``."""

    name: str  # recording-rule and alert name part
    title: str  # for summaries
    histogram: str
    le: str  # a bucket boundary of the histogram, as Prometheus labels it
    objective: float


def _row_selectors() -> tuple[tuple[str, str], ...]:
    return tuple((engine.source, engine.job_selector) for engine in engines.ENGINES)


@dataclass(frozen=True)
class EngineJobs:
    """The scrape job selector of each engine of ``ENGINES`` (pack/engines.py), by its
    source: each row's own by default, as ``alerts/build.py``'s
    ``--<source>-job-selector`` sets them otherwise."""

    selectors: tuple[tuple[str, str], ...] = field(default_factory=_row_selectors)

    def __getitem__(self, source: str) -> str:
        for known, selector in self.selectors:
            if known == source:
                return selector
        raise KeyError(f"no engine {source!r} in {[known for known, _ in self.selectors]}")

    def replace(self, **selectors: str | None) -> EngineJobs:
        """These selectors by source (each an engine of the table); ``None`` or ``""``
        keeps the one it had."""
        for source in selectors:
            self[source]  # KeyError for a source no row has
        return EngineJobs(
            tuple(
                (source, selectors.get(source) or selector) for source, selector in self.selectors
            )
        )


@dataclass(frozen=True)
class Settings:
    """The one table: everything a user may tune, each written once."""

    job_selector: str = 'job="gpuscope"'
    # the inference server's own /metrics (gpuscope_worker_*), scraped as its own job
    worker_job_selector: str = 'job="gpuscope-worker"'
    # each engine's own /metrics (vLLM's vllm:*, Triton's, ...), scraped as a job of its
    # own: its row's ``job_selector`` unless set here
    engine_jobs: EngineJobs = field(default_factory=EngineJobs)
    # NVIDIA's dcgm-exporter (DCGM_FI_*; alerts/dcgm_rules.py records them as gpuscope's
    # GPU series): its own job, or the GPU Operator's service "nvidia-dcgm-exporter"
    dcgm_job_selector: str = 'job=~"(nvidia-)?dcgm-exporter"'
    # where the GPU side's gpuscope_gpu_* series come from: gpuscope's exporter, or the
    # rules over dcgm-exporter (which keep its job), or both on different nodes
    gpu_job_selector: str = 'job=~"gpuscope|(nvidia-)?dcgm-exporter"'
    # The host of a scrape target, from its ``instance`` label (Prometheus anchors the
    # regex): "gpu-host-1:8000" and "gpu-host-1" give gpu-host-1, "[::1]:9420" [::1].
    # Requests without a GPU UUID meet the GPUs of the exporter on the same host.
    host_from_instance: str = "(.+?)(?::[0-9]+)?"
    # Where alerts/runbook.md is read; each alert's runbook_url is this and "#" and the
    # alert's section. No host serves the project, so the default is the runbook shipped
    # beside these rules, as a path from the repository root: it names the file of the
    # same commit in any checkout or repository browser, and never a host nobody owns.
    # A site sets the address its people open (its git host's view of the file, a wiki)
    # with alerts/build.py --runbook-url or GPUSCOPE_RUNBOOK_URL (alerts/README.md).
    runbook: str = RUNBOOK_PATH
    # requests an SLO counts: model calls, not /v1/models or health checks
    slo_selector: str = 'model!=""'
    interval: str = "30s"  # rule group evaluation interval
    window: str = "5m"  # window of rates and averages outside the SLOs
    for_override: str | None = None  # tests: every alert's ``for`` set to this
    # phase shares of the mean request time
    dominant_share: float = 0.5  # a phase above this share dominates latency
    underfed_queue_share: float = 0.25  # requests are queueing
    underfed_occupancy: float = 0.7  # SM occupancy under this while queueing: underfed
    # batch wait: the batcher's configured window and how far over it P99 may go
    # (the window is read from gpuscope_worker_max_queue_delay_seconds where a worker of
    # that model exports it; this value holds for the others)
    batch_wait_window_seconds: float = 0.005
    batch_wait_tolerance: float = 2.0
    # ... plus this much: a batch closes when the batcher's event loop runs again after
    # the window, which on a busy host (a CPU time slice, the GIL) is milliseconds
    # late however short the window, and P99 is interpolated inside latency buckets
    # 5, 10, 25 ms wide around short windows. On the 2-core development machine the
    # healthy demo's P99 reached 21 ms against its 5 ms window (docs/worker.md).
    batch_wait_slack_seconds: float = 0.02
    # KV cache: usage (averaged over ``window``) counted as full, and the requests that
    # may wait on average while it is full before that is a capacity problem. A
    # recompute preemption frees a whole sequence's blocks, and the head of the queue
    # waits until its blocks fit, so a cache that keeps running out averages 80-90 %
    # (measured on the reference worker), not 100 %.
    kv_cache_full_ratio: float = 0.8
    # the requests that hold KV-cache blocks (generation; embeddings hold none)
    kv_cache_endpoints: str = 'endpoint="completions"'
    kv_cache_waiting_requests: float = 1.0
    # throttling: SM clock under this fraction of its maximum while utilisation is high
    throttle_clock_ratio: float = 0.8
    throttle_min_utilization: float = 0.5
    pcie_utilization: float = 0.9  # of the link's capacity, either direction
    memory_used_ratio: float = 0.95
    error_ratio: float = 0.05  # 5xx share of model requests
    latency_slo: Slo = Slo(
        "latency", "Request latency", exporter_rows.REQUEST_DURATION.name, "1.0", 0.99
    )
    ttft_slo: Slo = Slo(
        "ttft", "Time to first token", exporter_rows.TIME_TO_FIRST_TOKEN.name, "0.5", 0.99
    )
    # multi-window multi-burn-rate (SRE workbook): (long, short, burn rate)
    page_burns: tuple[tuple[str, str, float], ...] = (("1h", "5m", 14.4), ("6h", "30m", 6.0))
    ticket_burns: tuple[tuple[str, str, float], ...] = (("1d", "2h", 3.0), ("3d", "6h", 1.0))
    # ``for:`` durations
    for_phase: str = "15m"
    for_slo_page: str = "2m"
    for_slo_ticket: str = "15m"
    for_error_ratio: str = "5m"
    for_gpu_hardware: str = "5m"
    for_gpu_lost: str = "1m"
    # an exporter asked for GPUs that serves none: it stays so until restarted, so the
    # wait only spares a start-up that is still opening its source
    for_gpu_source: str = "5m"
    for_exporter: str = "5m"
    for_exporter_signals: str = "10m"
    for_kv_cache: str = "10m"
    for_kv_cache_capacity: str = "15m"
    for_worker: str = "5m"
    # several processes on one GPU: held this long, so a process that starts and exits
    # is no co-tenant; a process on the far NUMA node stays so until restarted
    for_gpu_contended: str = "5m"
    for_numa_remote: str = "10m"
    # an SM clock that changed at least this often within ``window`` (the poller's
    # count, at its interval) swings: a locked one (nvidia-smi -lgc) reads 0; an
    # unlocked one under bursty load changes several times a minute
    clock_swing_changes: float = 5
    for_clock_unlocked: str = "10m"
    # an engine job (Triton, TGI, SGLang) whose targets all went away alerts when it had
    # one within this window; a job never seen is an engine the site does not run
    engine_seen_window: str = "1d"
    increase_window: str = "10m"  # XID, ECC, overflow and drop counts
    spans_idle_window: str = "10m"

    def sel(self, extra: str = "") -> str:
        """A label selector with the job and ``extra`` matchers."""
        return "{" + ", ".join(m for m in (self.job_selector, extra) if m) + "}"

    def gpu_sel(self, extra: str = "") -> str:
        """The selector of the GPU side's gpuscope_gpu_* series, with ``extra`` matchers."""
        return "{" + ", ".join(m for m in (self.gpu_job_selector, extra) if m) + "}"

    def dcgm_sel(self, extra: str = "") -> str:
        """The selector of dcgm-exporter's series, with ``extra`` matchers."""
        return "{" + ", ".join(m for m in (self.dcgm_job_selector, extra) if m) + "}"

    def worker_sel(self) -> str:
        """The selector of the worker's own metrics."""
        return "{" + self.worker_job_selector + "}"

    def engine_sel(self, engine: engines.Engine | str, extra: str = "") -> str:
        """The selector of an engine's own metrics (its row, or its source), with
        ``extra`` matchers."""
        source = engine if isinstance(engine, str) else engine.source
        return "{" + ", ".join(m for m in (self.engine_jobs[source], extra) if m) + "}"

    def for_(self, duration: str) -> str:
        return self.for_override if self.for_override is not None else duration

    def slo_windows(self) -> list[str]:
        burns = (*self.page_burns, *self.ticket_burns)
        return sorted({w for long, short, _ in burns for w in (long, short)}, key=seconds_of)


def seconds_of(duration: str) -> float:
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    return float(duration[:-1]) * units[duration[-1]]
