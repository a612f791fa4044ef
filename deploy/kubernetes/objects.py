"""The Kubernetes objects of gpuscope's exporter (Namespace, DaemonSet, Service,
monitors, the PrometheusRule, dashboard ConfigMaps) and the kustomize file shapes,
as plain dictionaries built from the pack's table (``pack.settings.KubeSettings``);
``components`` assembles them into the base and the components, ``build`` writes the
files. Like the rule and board builders, this one imports the pack and the contract
only: the rules' groups come from running ``alerts/build.py``, the dashboards from
the files ``dashboards/build.py`` wrote.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import yaml

from gpuscope.contract.http import HEALTHZ_PATH, METRICS_PATH, READYZ_PATH
from pack.documents import RULE_FILES, dump, prometheus_rule
from pack.engines import ENGINES
from pack.settings import KubeSettings

Obj = dict[str, Any]
REPO: Final = Path(__file__).resolve().parents[2]

EXPORTER: Final = "gpuscope"  # app.kubernetes.io/name of every object
# where the exporter's web config, TLS files and token are mounted (one projected volume)
CONFIG_DIR: Final = "/etc/gpuscope"
WEB_CONFIG: Final = "web-config.yml"
FLAGS_CONFIGMAP: Final = "gpuscope-exporter-flags"
WEB_CONFIG_SECRET: Final = "gpuscope-web-config"
TLS_SECRET: Final = "gpuscope-tls"
TOKEN_SECRET: Final = "gpuscope-otlp-token"
SCRAPE_AUTH_SECRET: Final = "gpuscope-scrape-auth"
COLLECTOR: Final = "gpuscope-otel-collector"
COLLECTOR_PORT: Final = 4318
WORKER_PORT: Final = 8000


def dashboard_folder() -> str:
    """The Grafana folder the provisioning files load the dashboards into."""
    provisioning = REPO / "dashboards" / "provisioning" / "dashboards" / "gpuscope.yml"
    providers = yaml.safe_load(provisioning.read_text(encoding="utf-8"))["providers"]
    folder: str = providers[0]["folder"]
    return folder


def labels(component: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": EXPORTER,
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/part-of": EXPORTER,
    }


def selector(component: str) -> dict[str, str]:
    # selectors are immutable: only the labels that never change with a release
    return {"app.kubernetes.io/name": EXPORTER, "app.kubernetes.io/component": component}


def meta(name: str, component: str, **extra: Any) -> Obj:
    return {"name": name, "labels": labels(component), **extra}


# --- the exporter ----------------------------------------------------------------------


def namespace(s: KubeSettings) -> Obj:
    # The exporter needs nothing the "restricted" Pod Security Standard forbids; the
    # components that need more (host pid namespace, host port) lower it themselves.
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": s.namespace,
            "labels": {
                **labels("namespace"),
                "pod-security.kubernetes.io/enforce": "restricted",
                "pod-security.kubernetes.io/warn": "restricted",
            },
        },
    }


def service_account() -> Obj:
    # The exporter never calls the Kubernetes API: no token is mounted.
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": meta(EXPORTER, "exporter"),
        "automountServiceAccountToken": False,
    }


def exporter_flags(s: KubeSettings) -> Obj:
    """The flags an operator tunes, as the exporter's environment twins (its defaults)."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": meta(FLAGS_CONFIGMAP, "exporter"),
        "data": {
            "GPUSCOPE_GPU_SOURCE": s.gpu_source,
            "GPUSCOPE_GPU_INTERVAL_S": f"{s.gpu_interval_s:g}",
            "GPUSCOPE_MAX_SERIES": str(s.max_series),
            "GPUSCOPE_MAX_DECOMPRESSED_BYTES": str(s.max_decompressed_bytes),
            "GPUSCOPE_LOG_LEVEL": s.log_level,
        },
    }


def web_config_secret(text: str) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": meta(WEB_CONFIG_SECRET, "exporter"),
        "type": "Opaque",
        "stringData": {WEB_CONFIG: text},
    }


PLAIN_WEB_CONFIG: Final = (
    "# Prometheus exporter-toolkit web config: tls_server_config and basic_auth_users.\n"
    "# Empty: plain HTTP, no authentication (the secure component sets both).\n"
)


def probe(path: str, period: int, scheme: str = "HTTP") -> Obj:
    return {
        "httpGet": {"path": path, "port": "http", "scheme": scheme},
        "periodSeconds": period,
        "timeoutSeconds": 3,
        "failureThreshold": 3,
    }


def config_volume(*sources: Obj) -> Obj:
    return {"name": "config", "projected": {"defaultMode": 0o440, "sources": list(sources)}}


def secret_source(name: str, items: Sequence[tuple[str, str]]) -> Obj:
    return {"secret": {"name": name, "items": [{"key": k, "path": p} for k, p in items]}}


def container_security(user_id: int) -> Obj:
    return {
        "runAsNonRoot": True,
        "runAsUser": user_id,
        "runAsGroup": user_id,
        "readOnlyRootFilesystem": True,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def pod_security(user_id: int) -> Obj:
    return {
        "runAsNonRoot": True,
        "runAsUser": user_id,
        "runAsGroup": user_id,
        # the projected config files (mode 0440) are readable by this group
        "fsGroup": user_id,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def pod_resource_env() -> list[Obj]:
    """The env of a container that sends spans: its pod's name and namespace from the
    downward API as the OpenTelemetry resource attributes ``k8s.pod.name`` and
    ``k8s.namespace.name`` (the SDK reads ``OTEL_RESOURCE_ATTRIBUTES``). The exporter
    labels the request series that name no GPU with them, and the rules join those to
    the GPU the pod holds (alerts/pod_join.py)."""
    return [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {
            "name": "OTEL_RESOURCE_ATTRIBUTES",
            "value": "k8s.pod.name=$(POD_NAME),k8s.namespace.name=$(POD_NAMESPACE)",
        },
    ]


def tmp_volume() -> tuple[Obj, Obj]:
    # the root filesystem is read-only; Python and libraries may still want a /tmp
    return (
        {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}},
        {"name": "tmp", "mountPath": "/tmp"},
    )


def daemonset(s: KubeSettings) -> Obj:
    tmp, tmp_mount = tmp_volume()
    container = {
        "name": "exporter",
        "image": s.image,
        "imagePullPolicy": "IfNotPresent",
        "args": [
            "exporter",
            f"--listen=:{s.port}",
            f"--shutdown-timeout-s={s.shutdown_timeout_s:g}",
            f"--web-config-file={CONFIG_DIR}/{WEB_CONFIG}",
        ],
        "envFrom": [{"configMapRef": {"name": FLAGS_CONFIGMAP}}],
        "env": [
            # the NVIDIA Container Toolkit mounts every GPU's device node and the
            # driver's NVML library, without taking a GPU from the device plugin
            {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
            {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "utility"},
        ],
        "ports": [{"name": "http", "containerPort": s.port, "protocol": "TCP"}],
        "livenessProbe": probe(HEALTHZ_PATH, 10),
        "readinessProbe": probe(READYZ_PATH, 5),
        "resources": {
            "requests": {"cpu": s.cpu_request, "memory": f"{s.memory_request_mib}Mi"},
            "limits": {"cpu": s.cpu_limit, "memory": f"{s.memory_limit_mib}Mi"},
        },
        "securityContext": container_security(s.user_id),
        "volumeMounts": [
            {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
            tmp_mount,
        ],
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": meta(EXPORTER, "exporter"),
        "spec": {
            "selector": {"matchLabels": selector("exporter")},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
            "template": {
                "metadata": {"labels": labels("exporter")},
                "spec": {
                    "serviceAccountName": EXPORTER,
                    "automountServiceAccountToken": False,
                    "runtimeClassName": s.runtime_class,
                    "nodeSelector": dict(s.node_selector),
                    "tolerations": [
                        {"key": s.gpu_taint, "operator": "Exists", "effect": "NoSchedule"}
                    ],
                    "terminationGracePeriodSeconds": s.grace_period_s,
                    "securityContext": pod_security(s.user_id),
                    "containers": [container],
                    "volumes": [
                        config_volume(secret_source(WEB_CONFIG_SECRET, [(WEB_CONFIG, WEB_CONFIG)])),
                        tmp,
                    ],
                },
            },
        },
    }


def service(s: KubeSettings) -> Obj:
    # Named after the scrape job the rules select (a ServiceMonitor's job is the
    # Service's name). internalTrafficPolicy Local: a pod's spans go to the exporter on
    # its own node, which reads the GPUs they ran on.
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta(s.exporter_job, "exporter"),
        "spec": {
            "type": "ClusterIP",
            "internalTrafficPolicy": "Local",
            "selector": selector("exporter"),
            "ports": [{"name": "http", "port": s.port, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def network_policy(s: KubeSettings) -> Obj:
    """Ingress to the exporter's port from span senders and Prometheus only.

    /v1/traces and /metrics share the port, so the policy cannot tell them apart: a
    sender may also scrape, Prometheus may also send. The kubelet's probes come from
    the node, which a NetworkPolicy never blocks.
    """
    sender_key, sender_value = s.span_sender_label
    prometheus_key, prometheus_value = s.prometheus_pod_label
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": meta(EXPORTER, "exporter"),
        "spec": {
            "podSelector": {"matchLabels": selector("exporter")},
            "policyTypes": ["Ingress"],
            "ingress": [
                {
                    "from": [
                        {  # pods labelled as span senders, in any namespace
                            "namespaceSelector": {},
                            "podSelector": {"matchLabels": {sender_key: sender_value}},
                        },
                        {
                            "namespaceSelector": {
                                "matchLabels": {
                                    "kubernetes.io/metadata.name": s.prometheus_namespace
                                }
                            },
                            "podSelector": {"matchLabels": {prometheus_key: prometheus_value}},
                        },
                    ],
                    "ports": [{"port": s.port, "protocol": "TCP"}],
                }
            ],
        },
    }


def relabelings(job: str) -> list[Obj]:
    """The scrape's ``job`` as the rules select it; ``instance`` as ``<node>/<pod>:<port>``."""
    return [
        {"action": "replace", "targetLabel": "job", "replacement": job},
        {
            "action": "replace",
            "sourceLabels": [
                "__meta_kubernetes_pod_node_name",
                "__meta_kubernetes_pod_name",
                "__address__",
            ],
            "separator": ";",
            "regex": "(.+);(.+);.*:([0-9]+)",
            "targetLabel": "instance",
            "replacement": "$1/$2:$3",
        },
    ]


def endpoint(s: KubeSettings, job: str, **extra: Any) -> Obj:
    return {
        "port": "http",
        "path": METRICS_PATH,
        "interval": s.scrape_interval,
        **extra,
        "relabelings": relabelings(job),
    }


def service_monitor(s: KubeSettings, name: str, component: str, job: str, **extra: Any) -> Obj:
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": meta(name, component),
        "spec": {
            "selector": {"matchLabels": selector(component)},
            "endpoints": [endpoint(s, job, **extra)],
        },
    }


def pod_monitor(s: KubeSettings) -> Obj:
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": meta(EXPORTER, "exporter"),
        "spec": {
            "selector": {"matchLabels": selector("exporter")},
            "podMetricsEndpoints": [endpoint(s, s.exporter_job)],
        },
    }


def rule_flags(s: KubeSettings) -> list[str]:
    """``alerts/build.py``'s flags that build the rules of ``s.rules``: the job selectors,
    the host regex, the runbook, the interval, window and ``for`` (the rest of
    ``Settings`` has no flag: it is the pack's table, which the rule builder reads as
    this one does)."""
    r = s.rules
    flags = {
        "--job-selector": r.job_selector,
        "--worker-job-selector": r.worker_job_selector,
        "--gpu-job-selector": r.gpu_job_selector,
        "--dcgm-job-selector": r.dcgm_job_selector,
        **{f"--{e.source}-job-selector": r.engine_jobs[e.source] for e in ENGINES},
        "--host-from-instance": r.host_from_instance,
        "--runbook-url": r.runbook,
        "--interval": r.interval,
        "--window": r.window,
        "--for": r.for_override,
    }
    return [f"{flag}={value}" for flag, value in flags.items() if value is not None]


def rule_groups(s: KubeSettings) -> list[Obj]:
    """The groups of the rule files ``alerts/build.py`` writes for ``s.rules``, in the
    order of ``RULE_FILES``: the rule builder runs as a program, so that this builder
    imports nothing of it."""
    with tempfile.TemporaryDirectory(prefix="gpuscope-rules-") as out:
        command = [sys.executable, str(REPO / "alerts" / "build.py"), "--out", out]
        subprocess.run([*command, *rule_flags(s)], check=True, stdout=subprocess.DEVNULL)
        groups: list[Obj] = []
        for name in RULE_FILES:
            groups += yaml.safe_load((Path(out) / name).read_text(encoding="utf-8"))["groups"]
    return groups


def rule(s: KubeSettings) -> Obj:
    return prometheus_rule(rule_groups(s), meta(EXPORTER, "rules"))


def dashboard_configmaps(s: KubeSettings) -> dict[str, Obj]:
    """File name -> ConfigMap of each committed dashboard, for Grafana's sidecar."""
    out = {}
    folder = dashboard_folder()
    for path in sorted((REPO / "dashboards" / "json").glob("*.json")):
        name = f"gpuscope-dashboard-{path.stem}"
        out[f"dashboard-{path.stem}.yaml"] = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": name,
                "labels": {**labels("dashboards"), s.dashboard_label[0]: s.dashboard_label[1]},
                "annotations": {s.dashboard_folder_annotation: folder},
            },
            "data": {path.name: path.read_text(encoding="utf-8")},
        }
    return out


# --- kustomize files -------------------------------------------------------------------


def kustomization(**fields: Any) -> Obj:
    return {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization", **fields}


def component(**fields: Any) -> Obj:
    return {"apiVersion": "kustomize.config.k8s.io/v1alpha1", "kind": "Component", **fields}


def target(kind: str, name: str) -> Obj:
    return {"kind": kind, "name": name}


def json_patch(kind: str, name: str, ops: list[Obj]) -> Obj:
    return {"target": target(kind, name), "patch": dump(ops)}


def merge_patch(document: Obj) -> Obj:
    return {"patch": dump(document)}
