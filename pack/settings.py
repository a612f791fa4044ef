"""The one table of the pack: every threshold, selector, window and ``for:`` of the rules
and boards (``Settings``), and its Kubernetes section (``KubeSettings``: names,
placement, resources, images of the manifests).

``alerts/build.py`` writes the rule files from a ``Settings``, its flags override a few
fields for fast test variants; the boards read the same ``Settings``;
``deploy/kubernetes/build.py`` writes the manifests from a ``KubeSettings``, which holds
the ``Settings`` its rules and scrape jobs are built with.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from importlib import metadata
from typing import Final

from gpuscope.contract import exporter as exporter_rows
from gpuscope.contract.http import DEFAULT_PORT
from pack import engines
from pack.contract import ENDPOINT, GPU_INDEX, MODEL, SERVICE, UUID

# The labels of service_model_gpu:* series: the source the numbers came through (see
# pack/engines/), then what the request ran on. ``host`` is the scrape
# target's host (its ``instance`` without the port): the GPU join of requests that
# name no GPU (``gpu`` and ``uuid`` empty).
# ``source`` is the pack's own label (no gpuscope process serves it; the exporter's
# gpuscope_exporter_gpu_source has a label of the same name and another meaning):
# written here once for the builders that select and group by it.
SOURCE = "source"
SERVICE_MODEL = f"{SERVICE}, {MODEL}"
GPU = f"{GPU_INDEX}, {UUID}"
REQUEST = f"{SERVICE_MODEL}, host, {GPU}"
SMG = f"{SOURCE}, {REQUEST}"
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
    """The scrape job selector of each engine of ``ENGINES`` (pack/engines/), by its
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
    slo_selector: str = f'{MODEL}!=""'
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
    kv_cache_endpoints: str = f'{ENDPOINT}="completions"'
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


# --- the Kubernetes manifests ------------------------------------------------------------

# How a pod's scrape target is named on Kubernetes: ``<node>/<pod>:<port>`` (the
# relabelling of deploy/kubernetes/objects.py writes it). The node comes first, so that
# the rules' host (the per-host GPU join of requests that name no GPU) is the node, the
# same for the exporter and for every engine pod on it; the pod keeps two engines on one
# node apart. Prometheus anchors the regex; it still reads ``host:port`` and
# ``[::1]:9420`` as the default does.
HOST_FROM_INSTANCE: Final = "(.+?)(?:/.+)?(?::[0-9]+)?"

# After SIGTERM the exporter gives requests in flight up to --shutdown-timeout-s,
# then its forwarder the same bound to drain, then a second for the last 503s and
# the GPU poller's join; the kubelet's grace period covers both bounds and this.
SHUTDOWN_MARGIN_S: Final = 5

# Decoding one /v1/traces body takes up to about 35 times --max-decompressed-bytes
# in memory (the flag's help), one request at a time; the limit holds that on top of
# the exporter's resident size with series at --max-series.
DECODE_MEMORY_FACTOR: Final = 35
BASELINE_MEMORY_MIB: Final = 256
MIB: Final = 1024 * 1024


def job_name(selector: str) -> str:
    """``job="gpuscope"`` -> ``gpuscope``: the job a scrape must be labelled with."""
    match = re.fullmatch(r'job="([^"]+)"', selector)
    if match is None:
        raise ValueError(f"cannot name a scrape job after the selector {selector!r}")
    return match.group(1)


@dataclass(frozen=True)
class KubeSettings:
    """The Kubernetes section of the table. What the rest of the pack decides is read
    from ``rules`` (the scrape job names the rules select); the port from the contract."""

    namespace: str = "gpuscope"
    # the overlays whose exporter needs the host (hostPID, hostPort) run in a namespace
    # of their own, so that lowering its Pod Security Standard to "privileged" lets no
    # other pod in
    privileged_namespace: str = "gpuscope-host"
    # the image built from the repository's Dockerfile; an overlay's ``images:`` names
    # the registry it was pushed to. Its tag is the installed gpuscope's version.
    image: str = "gpuscope"
    image_tag: str = field(default_factory=lambda: metadata.version("gpuscope"))
    # GPU nodes: the label NVIDIA's GPU Feature Discovery (GPU Operator) puts on them,
    # and the taint GPU node pools usually carry
    node_selector: tuple[tuple[str, str], ...] = (("nvidia.com/gpu.present", "true"),)
    gpu_taint: str = "nvidia.com/gpu"
    # the RuntimeClass that makes the NVIDIA Container Toolkit inject the driver's
    # libraries and devices (the GPU Operator creates "nvidia")
    runtime_class: str = "nvidia"
    # the exporter runs as the image's user (Dockerfile: useradd --uid 10001); the other
    # pods as users of their own, so that an exporter in the host's pid namespace
    # (process-join) is never the same user as a process it can see
    user_id: int = 10001
    worker_user_id: int = 10002
    collector_user_id: int = 10003
    cpu_request: str = "100m"
    cpu_limit: str = "1"
    memory_request_mib: int = 128
    # The exporter's port (the contract's default) and the flags the manifests pass the
    # exporter (its arguments, the ConfigMap of environment twins) and the worker: the
    # defaults of their own parsers, which tests/kubernetes holds these equal to.
    port: int = DEFAULT_PORT
    shutdown_timeout_s: float = 10.0
    gpu_source: str = "auto"
    gpu_interval_s: float = 1.0
    max_series: int = 2000
    max_decompressed_bytes: int = 20 * MIB
    max_ingest_bytes: int = 96 * MIB
    log_level: str = "info"
    worker_shutdown_timeout_s: float = 10.0
    # Prometheus Operator labels: kube-prometheus-stack's Prometheus selects
    # ServiceMonitors, PodMonitors and PrometheusRules by its Helm release name
    release_label: tuple[str, str] = ("release", "kube-prometheus-stack")
    # who may reach the exporter's port (its NetworkPolicy): pods with this label, in
    # any namespace, to send spans; and Prometheus, by its namespace and pod label
    # (kube-prometheus-stack installed in "monitoring")
    span_sender_label: tuple[str, str] = ("gpuscope/span-sender", "true")
    prometheus_namespace: str = "monitoring"
    prometheus_pod_label: tuple[str, str] = ("app.kubernetes.io/name", "prometheus")
    scrape_interval: str = "30s"
    # kube-prometheus-stack's Grafana sidecar loads ConfigMaps with this label
    dashboard_label: tuple[str, str] = ("grafana_dashboard", "1")
    # ... and puts each in the folder this annotation names (the sidecar's
    # folderAnnotation value)
    dashboard_folder_annotation: str = "grafana_folder"
    # NVIDIA's GPU Operator's dcgm-exporter, which the dcgm-exporter component scrapes:
    # its Service (the operator names it nvidia-dcgm-exporter and labels it app of that
    # name, port gpu-metrics, 9400) in the namespace the operator is installed in (its
    # documented "gpu-operator"). The scrape's job is the Service's name, which
    # ``Settings.dcgm_job_selector`` selects.
    dcgm_exporter_service: str = "nvidia-dcgm-exporter"
    dcgm_exporter_namespace: str = "gpu-operator"
    dcgm_exporter_labels: tuple[tuple[str, str], ...] = (("app", "nvidia-dcgm-exporter"),)
    dcgm_exporter_port: str = "gpu-metrics"
    # vLLM's pods, which the vllm component scrapes as the vllm job (any namespace):
    # their label and the name of the container port serving /metrics
    vllm_labels: tuple[tuple[str, str], ...] = (("app", "vllm"),)
    vllm_port: str = "http"
    # the OpenTelemetry Collector of the otel-collector component, and where it sends
    collector_image: str = "otel/opentelemetry-collector:0.115.0"
    tempo_otlp_http: str = "http://tempo.monitoring.svc:4318"
    # the table the PrometheusRule's groups are built from (deploy/kubernetes/build.py
    # runs alerts/build.py with its selectors, host regex and runbook) and whose job
    # selectors name the scrapes
    rules: Settings = field(
        default_factory=lambda: dataclasses.replace(
            Settings(), host_from_instance=HOST_FROM_INSTANCE
        )
    )

    @property
    def exporter_job(self) -> str:
        return job_name(self.rules.job_selector)

    @property
    def worker_job(self) -> str:
        return job_name(self.rules.worker_job_selector)

    @property
    def vllm_job(self) -> str:
        return job_name(self.rules.engine_jobs[engines.VLLM])

    @property
    def grace_period_s(self) -> int:
        return math.ceil(2 * self.shutdown_timeout_s) + SHUTDOWN_MARGIN_S

    @property
    def worker_grace_period_s(self) -> int:
        # the worker drains its requests for up to its --shutdown-timeout-s
        return math.ceil(self.worker_shutdown_timeout_s) + SHUTDOWN_MARGIN_S

    @property
    def memory_limit_mib(self) -> int:
        # the process itself, the one request being decoded, and the bodies that
        # --max-ingest-bytes lets the exporter hold while they wait (429 past it)
        held = DECODE_MEMORY_FACTOR * self.max_decompressed_bytes + self.max_ingest_bytes
        return BASELINE_MEMORY_MIB + math.ceil(held / MIB)

    def service_host(self, name: str) -> str:
        return f"{name}.{self.namespace}.svc"
