"""The one table of the Kubernetes manifests: names, placement, resources, images.

What the rest of the pack already decides is read from there, never written again:
the scrape job names from ``pack/settings.py`` (the rules select them), the
exporter's port, shutdown timeout and flag defaults from its own parser, the
dashboards' folder from ``dashboards/provisioning/``. ``build.py`` turns this table
into the objects of ``base/``, ``components/`` and ``overlays/``.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import yaml

from gpuscope import __version__, flags
from gpuscope.exporter.config import ExporterConfig
from gpuscope.worker.config import WorkerConfig
from pack.engines import VLLM
from pack.settings import Settings

REPO: Final = Path(__file__).resolve().parents[2]

# How a pod's scrape target is named on Kubernetes: ``<node>/<pod>:<port>`` (the
# relabelling in ``build.py`` writes it). The node comes first, so that the rules'
# host (the per-host GPU join of requests that name no GPU) is the node, the same
# for the exporter and for every engine pod on it; the pod keeps two engines on one
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


def job_name(selector: str) -> str:
    """``job="gpuscope"`` -> ``gpuscope``: the job a scrape must be labelled with."""
    match = re.fullmatch(r'job="([^"]+)"', selector)
    if match is None:
        raise ValueError(f"cannot name a scrape job after the selector {selector!r}")
    return match.group(1)


def exporter_defaults() -> ExporterConfig:
    """The exporter's defaults, as its parser gives them without flags or environment."""
    return flags.parse(ExporterConfig, [], {}, exit_on_error=False)


def dashboard_folder() -> str:
    """The Grafana folder the provisioning files load the dashboards into."""
    provisioning = REPO / "dashboards" / "provisioning" / "dashboards" / "gpuscope.yml"
    providers = yaml.safe_load(provisioning.read_text(encoding="utf-8"))["providers"]
    folder: str = providers[0]["folder"]
    return folder


@dataclass(frozen=True)
class KubeSettings:
    namespace: str = "gpuscope"
    # the overlays whose exporter needs the host (hostPID, hostPort) run in a namespace
    # of their own, so that lowering its Pod Security Standard to "privileged" lets no
    # other pod in
    privileged_namespace: str = "gpuscope-host"
    # the image built from the repository's Dockerfile; an overlay's ``images:`` names
    # the registry it was pushed to
    image: str = "gpuscope"
    image_tag: str = __version__
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
    # pack/settings.py's dcgm_job_selector selects.
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
        return job_name(self.rules.engine_jobs[VLLM])

    @property
    def port(self) -> int:
        return exporter_defaults().listen_address()[1]

    @property
    def shutdown_timeout_s(self) -> float:
        return exporter_defaults().shutdown_timeout_s

    @property
    def grace_period_s(self) -> int:
        return math.ceil(2 * self.shutdown_timeout_s) + SHUTDOWN_MARGIN_S

    @property
    def worker_grace_period_s(self) -> int:
        # the worker drains its requests for up to its --shutdown-timeout-s
        worker = flags.parse(WorkerConfig, [], {}, exit_on_error=False)
        return math.ceil(worker.shutdown_timeout_s) + SHUTDOWN_MARGIN_S

    @property
    def memory_limit_mib(self) -> int:
        # the process itself, the one request being decoded, and the bodies that
        # --max-ingest-bytes lets the exporter hold while they wait (429 past it)
        defaults = exporter_defaults()
        held = DECODE_MEMORY_FACTOR * defaults.max_decompressed_bytes + defaults.max_ingest_bytes
        return BASELINE_MEMORY_MIB + math.ceil(held / (1024 * 1024))

    def service_host(self, name: str) -> str:
        return f"{name}.{self.namespace}.svc"
