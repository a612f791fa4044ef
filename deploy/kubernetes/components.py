"""The kustomize base, its components and the overlays that combine them.

Each component is a function of ``KubeSettings`` giving its files (name -> object or
list of objects); ``COMPONENTS`` names them and ``OVERLAYS`` says which an overlay
adds to the base.
"""

from __future__ import annotations

from typing import Final

from deploy.kubernetes.objects import (
    COLLECTOR,
    COLLECTOR_PORT,
    CONFIG_DIR,
    EXPORTER,
    FLAGS_CONFIGMAP,
    PLAIN_WEB_CONFIG,
    SCRAPE_AUTH_SECRET,
    TLS_SECRET,
    TOKEN_SECRET,
    WEB_CONFIG,
    WEB_CONFIG_SECRET,
    WORKER_PORT,
    Obj,
    component,
    config_volume,
    container_security,
    daemonset,
    dashboard_configmaps,
    endpoint,
    exporter_flags,
    json_patch,
    kustomization,
    labels,
    merge_patch,
    meta,
    namespace,
    network_policy,
    pod_monitor,
    pod_resource_env,
    pod_security,
    probe,
    relabelings,
    rule,
    secret_source,
    selector,
    service,
    service_account,
    service_monitor,
    tmp_volume,
    web_config_secret,
)
from gpuscope.contract.gpu import simulated_uuid

# The secure component's example credentials are the contract's: the hash is of the
# password in the scrape-auth Secret (bcrypt, cost 10); all are placeholders to replace,
# and the exporter refuses to start with them.
from gpuscope.contract.http import (
    EXAMPLE_HASH,
    EXAMPLE_PASSWORD,
    EXAMPLE_TOKEN,
    EXAMPLE_USER,
    HEALTHZ_PATH,
    METRICS_PATH,
    READYZ_PATH,
    TRACES_PATH,
)
from pack.documents import dump
from pack.settings import KubeSettings


def base(s: KubeSettings) -> dict[str, Obj | list[Obj]]:
    dashboards = dashboard_configmaps(s)
    files: dict[str, Obj | list[Obj]] = {
        "namespace.yaml": namespace(s),
        "serviceaccount.yaml": service_account(),
        "exporter-flags.yaml": exporter_flags(s),
        "web-config.yaml": web_config_secret(PLAIN_WEB_CONFIG),
        "daemonset.yaml": daemonset(s),
        "service.yaml": service(s),
        "networkpolicy.yaml": network_policy(s),
        "servicemonitor.yaml": service_monitor(s, EXPORTER, "exporter", s.exporter_job),
        "prometheusrule.yaml": rule(s),
        **dashboards,
    }
    files["kustomization.yaml"] = kustomization(
        namespace=s.namespace,
        resources=list(files),
        images=image_entries(s),
    )
    return files


def image_entries(s: KubeSettings) -> list[Obj]:
    """The one ``images:`` entry: every gpuscope container runs ``image:image_tag``."""
    return [{"name": s.image, "newTag": s.image_tag}]


def kube_prometheus_stack(s: KubeSettings) -> dict[str, Obj | list[Obj]]:
    """The ``release`` label kube-prometheus-stack's Prometheus selects monitors and rules by."""
    key, value = s.release_label
    ops = [{"op": "add", "path": f"/metadata/labels/{key}", "value": value}]
    return {
        "kustomization.yaml": component(
            patches=[
                {"target": {"kind": kind}, "patch": dump(ops)}
                for kind in ("ServiceMonitor", "PodMonitor", "PrometheusRule")
            ]
        )
    }


def podmonitor_component(s: KubeSettings) -> dict[str, Obj | list[Obj]]:
    """A PodMonitor in place of the ServiceMonitor (the Service stays, for OTLP)."""
    return {
        "podmonitor.yaml": pod_monitor(s),
        "kustomization.yaml": component(
            resources=["podmonitor.yaml"],
            patches=[
                merge_patch(
                    {
                        "apiVersion": "monitoring.coreos.com/v1",
                        "kind": "ServiceMonitor",
                        "metadata": {"name": EXPORTER},
                        "$patch": "delete",
                    }
                )
            ],
        ),
    }


def secure_component(s: KubeSettings) -> dict[str, Obj | list[Obj]]:
    """TLS on the exporter's port, basic auth on scrapes, a bearer token on /v1/traces."""
    web_config = (
        "# Prometheus exporter-toolkit web config; paths are relative to this file.\n"
        "tls_server_config:\n"
        "  cert_file: tls.crt\n"
        "  key_file: tls.key\n"
        "basic_auth_users:\n"
        f"  # bcrypt hash of the password in the {SCRAPE_AUTH_SECRET} Secret: replace both\n"
        f"  {EXAMPLE_USER}: {EXAMPLE_HASH}\n"
    )
    scrape_auth = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": meta(SCRAPE_AUTH_SECRET, "exporter"),
        "type": "kubernetes.io/basic-auth",
        "stringData": {"username": EXAMPLE_USER, "password": EXAMPLE_PASSWORD},
    }
    token = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": meta(TOKEN_SECRET, "exporter"),
        "type": "Opaque",
        "stringData": {"token": EXAMPLE_TOKEN},
    }
    volume = config_volume(
        secret_source(WEB_CONFIG_SECRET, [(WEB_CONFIG, WEB_CONFIG)]),
        # kubernetes.io/tls Secret (cert-manager's Certificate writes one), not shipped
        secret_source(TLS_SECRET, [("tls.crt", "tls.crt"), ("tls.key", "tls.key")]),
        secret_source(TOKEN_SECRET, [("token", "otlp-token")]),
    )
    tmp, _ = tmp_volume()
    pod_patch = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": EXPORTER},
        "spec": {
            "template": {
                "spec": {
                    "containers": [
                        {
                            "name": "exporter",
                            "livenessProbe": probe(HEALTHZ_PATH, 10, "HTTPS"),
                            "readinessProbe": probe(READYZ_PATH, 5, "HTTPS"),
                        }
                    ],
                    "volumes": [volume, tmp],
                }
            }
        },
    }
    flags_patch = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": FLAGS_CONFIGMAP},
        "data": {"GPUSCOPE_BEARER_TOKEN_FILE": f"{CONFIG_DIR}/otlp-token"},
    }
    scrape = endpoint(
        s,
        s.exporter_job,
        scheme="https",
        tlsConfig={
            "ca": {"secret": {"name": TLS_SECRET, "key": "ca.crt"}},
            # targets are pod IPs; the certificate names the Service
            "serverName": s.service_host(s.exporter_job),
        },
        basicAuth={
            "username": {"name": SCRAPE_AUTH_SECRET, "key": "username"},
            "password": {"name": SCRAPE_AUTH_SECRET, "key": "password"},
        },
    )
    monitor_patch = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": {"name": EXPORTER},
        "spec": {"endpoints": [scrape]},
    }
    return {
        "scrape-auth.yaml": scrape_auth,
        "otlp-token.yaml": token,
        "kustomization.yaml": component(
            resources=["scrape-auth.yaml", "otlp-token.yaml"],
            patches=[
                merge_patch(web_config_secret(web_config)),
                merge_patch(pod_patch),
                merge_patch(flags_patch),
                merge_patch(monitor_patch),
            ],
        ),
    }


def lower_pod_security(level: str) -> Obj:
    # By kind only: the overlay renames the Namespace (``OVERLAY_NAMESPACES``).
    return {
        "target": {"kind": "Namespace"},
        "patch": dump(
            [
                {
                    "op": "replace",
                    "path": f"/metadata/labels/pod-security.kubernetes.io~1{mode}",
                    "value": level,
                }
                for mode in ("enforce", "warn")
            ]
        ),
    }


def process_join_component(s: KubeSettings) -> dict[str, Obj | list[Obj]]:
    """The host's pid namespace, so that spans' process.pid meet NVML's process lists."""
    return {
        "kustomization.yaml": component(
            patches=[
                json_patch(
                    "DaemonSet",
                    EXPORTER,
                    [{"op": "add", "path": "/spec/template/spec/hostPID", "value": True}],
                ),
                lower_pod_security("privileged"),
            ]
        )
    }


def host_port_component(s: KubeSettings) -> dict[str, Obj | list[Obj]]:
    """The exporter's port on each node's address, for senders that use status.hostIP."""
    return {
        "kustomization.yaml": component(
            patches=[
                json_patch(
                    "DaemonSet",
                    EXPORTER,
                    [
                        {
                            "op": "add",
                            "path": "/spec/template/spec/containers/0/ports/0/hostPort",
                            "value": s.port,
                        }
                    ],
                ),
                lower_pod_security("privileged"),
            ]
        )
    }


def collector_component(s: KubeSettings) -> dict[str, Obj | list[Obj]]:
    """An OpenTelemetry Collector that takes every exporter's forwarded spans to Tempo."""
    config = (
        "receivers:\n"
        "  otlp:\n"
        "    protocols:\n"
        "      http:\n"
        f"        endpoint: 0.0.0.0:{COLLECTOR_PORT}\n"
        "processors:\n"
        "  memory_limiter:\n"
        "    check_interval: 1s\n"
        "    limit_percentage: 80\n"
        "    spike_limit_percentage: 20\n"
        "  batch: {}\n"
        "exporters:\n"
        "  otlphttp:\n"
        f"    endpoint: {s.tempo_otlp_http}\n"
        "service:\n"
        "  pipelines:\n"
        "    traces:\n"
        "      receivers: [otlp]\n"
        "      processors: [memory_limiter, batch]\n"
        "      exporters: [otlphttp]\n"
    )
    configmap = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": meta(COLLECTOR, "collector"),
        "data": {"config.yaml": config},
    }
    tmp, tmp_mount = tmp_volume()
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta(COLLECTOR, "collector"),
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": selector("collector")},
            "template": {
                "metadata": {"labels": labels("collector")},
                "spec": {
                    "automountServiceAccountToken": False,
                    "securityContext": pod_security(s.collector_user_id),
                    "containers": [
                        {
                            "name": "collector",
                            "image": s.collector_image,
                            "args": ["--config=/etc/otelcol/config.yaml"],
                            "ports": [{"name": "otlp-http", "containerPort": COLLECTOR_PORT}],
                            "resources": {
                                "requests": {"cpu": "100m", "memory": "128Mi"},
                                "limits": {"cpu": "1", "memory": "512Mi"},
                            },
                            "securityContext": container_security(s.collector_user_id),
                            "volumeMounts": [
                                {"name": "config", "mountPath": "/etc/otelcol", "readOnly": True},
                                tmp_mount,
                            ],
                        }
                    ],
                    "volumes": [{"name": "config", "configMap": {"name": COLLECTOR}}, tmp],
                },
            },
        },
    }
    svc = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta(COLLECTOR, "collector"),
        "spec": {
            "selector": selector("collector"),
            "ports": [{"name": "otlp-http", "port": COLLECTOR_PORT, "targetPort": "otlp-http"}],
        },
    }
    flags_patch = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": FLAGS_CONFIGMAP},
        "data": {
            "GPUSCOPE_FORWARD_OTLP": f"http://{s.service_host(COLLECTOR)}:{COLLECTOR_PORT}{TRACES_PATH}"
        },
    }
    # the Collector takes spans from the exporters only
    policy = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": meta(COLLECTOR, "collector"),
        "spec": {
            "podSelector": {"matchLabels": selector("collector")},
            "policyTypes": ["Ingress"],
            "ingress": [
                {
                    "from": [{"podSelector": {"matchLabels": selector("exporter")}}],
                    "ports": [{"port": COLLECTOR_PORT, "protocol": "TCP"}],
                }
            ],
        },
    }
    return {
        "collector-config.yaml": configmap,
        "collector.yaml": deployment,
        "collector-service.yaml": svc,
        "collector-networkpolicy.yaml": policy,
        "kustomization.yaml": component(
            resources=[
                "collector-config.yaml",
                "collector.yaml",
                "collector-service.yaml",
                "collector-networkpolicy.yaml",
            ],
            patches=[merge_patch(flags_patch)],
        ),
    }


def simulated_component(s: KubeSettings) -> dict[str, Obj | list[Obj]]:
    """Simulated GPUs on every node: the pack on a cluster without GPUs (kind, minikube)."""
    flags_patch = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": FLAGS_CONFIGMAP},
        "data": {"GPUSCOPE_GPU_SOURCE": "simulated", "GPUSCOPE_SIMULATED_GPUS": "1"},
    }
    spec = "/spec/template/spec"
    return {
        "kustomization.yaml": component(
            patches=[
                merge_patch(flags_patch),
                json_patch(
                    "DaemonSet",
                    EXPORTER,
                    [
                        {"op": "remove", "path": f"{spec}/runtimeClassName"},
                        {"op": "remove", "path": f"{spec}/nodeSelector"},
                    ],
                ),
            ]
        )
    }


def worker_component(s: KubeSettings) -> dict[str, Obj | list[Obj]]:
    """The reference worker (NumPy) as a Deployment, its Service and ServiceMonitor."""
    tmp, tmp_mount = tmp_volume()
    exporter_url = f"http://{s.service_host(s.exporter_job)}:{s.port}{TRACES_PATH}"
    sender_key, sender_value = s.span_sender_label
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta("gpuscope-worker", "worker"),
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": selector("worker")},
            "template": {
                # the span-sender label lets it through the exporter's NetworkPolicy
                "metadata": {"labels": {**labels("worker"), sender_key: sender_value}},
                "spec": {
                    "automountServiceAccountToken": False,
                    "securityContext": pod_security(s.worker_user_id),
                    "terminationGracePeriodSeconds": s.worker_grace_period_s,
                    "containers": [
                        {
                            "name": "worker",
                            "image": s.image,
                            "imagePullPolicy": "IfNotPresent",
                            "args": [
                                "worker",
                                "--host=0.0.0.0",
                                f"--port={WORKER_PORT}",
                                # the simulated GPU 0 of the exporter on the same node
                                f"--gpu-uuid={simulated_uuid(0)}",
                                f"--otlp-endpoint={exporter_url}",
                                f"--service-name={s.worker_job}",
                            ],
                            # its spans name their pod (the join by pod, for spans
                            # that name no GPU)
                            "env": pod_resource_env(),
                            "ports": [
                                {"name": "http", "containerPort": WORKER_PORT, "protocol": "TCP"}
                            ],
                            "livenessProbe": probe(HEALTHZ_PATH, 10),
                            "readinessProbe": probe(READYZ_PATH, 5),
                            "resources": {
                                "requests": {"cpu": "500m", "memory": "256Mi"},
                                "limits": {"cpu": "2", "memory": "1Gi"},
                            },
                            "securityContext": container_security(s.worker_user_id),
                            "volumeMounts": [tmp_mount],
                        }
                    ],
                    "volumes": [tmp],
                },
            },
        },
    }
    svc = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta(s.worker_job, "worker"),
        "spec": {
            "selector": selector("worker"),
            "ports": [{"name": "http", "port": WORKER_PORT, "targetPort": "http"}],
        },
    }
    monitor = service_monitor(s, "gpuscope-worker", "worker", s.worker_job)
    return {
        "worker.yaml": deployment,
        "worker-service.yaml": svc,
        "worker-servicemonitor.yaml": monitor,
        "kustomization.yaml": component(
            resources=["worker.yaml", "worker-service.yaml", "worker-servicemonitor.yaml"]
        ),
    }


# The objects of base/ that run or reach gpuscope's exporter: what the no-daemon
# component deletes, leaving the Namespace, the PrometheusRule and the dashboards.
EXPORTER_OBJECTS: Final = (
    ("apps/v1", "DaemonSet", EXPORTER),
    ("v1", "Service", EXPORTER),
    ("monitoring.coreos.com/v1", "ServiceMonitor", EXPORTER),
    ("networking.k8s.io/v1", "NetworkPolicy", EXPORTER),
    ("v1", "ConfigMap", FLAGS_CONFIGMAP),
    ("v1", "Secret", WEB_CONFIG_SECRET),
    ("v1", "ServiceAccount", EXPORTER),
)


def no_daemon_component(s: KubeSettings) -> dict[str, Obj | list[Obj]]:
    """No gpuscope process: base/ without the exporter and what serves it, so that the
    rules and dashboards read dcgm-exporter's and the engines' own series."""
    return {
        "kustomization.yaml": component(
            patches=[
                merge_patch(
                    {
                        "apiVersion": api,
                        "kind": kind,
                        "metadata": {"name": name},
                        "$patch": "delete",
                    }
                )
                for api, kind, name in EXPORTER_OBJECTS
            ]
        )
    }


def dcgm_exporter_component(s: KubeSettings) -> dict[str, Obj | list[Obj]]:
    """A ServiceMonitor of the GPU Operator's dcgm-exporter, as the dcgm-exporter rules
    read it."""
    job = s.dcgm_exporter_service
    monitor = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": meta(job, "dcgm-exporter"),
        "spec": {
            "namespaceSelector": {"matchNames": [s.dcgm_exporter_namespace]},
            "selector": {"matchLabels": dict(s.dcgm_exporter_labels)},
            "endpoints": [
                {
                    "port": s.dcgm_exporter_port,
                    "path": METRICS_PATH,
                    "interval": s.scrape_interval,
                    "relabelings": [
                        *relabelings(job),
                        # The Operator labels each target with the scraped pod's own
                        # pod, namespace and container: dcgm-exporter's. They would
                        # rename the GPU's holder pod's labels to exported_* and put
                        # dcgm-exporter's pod on every GPU no pod holds; dropped, the
                        # series keep the labels dcgm-exporter writes, and only those.
                        {"action": "labeldrop", "regex": "pod|namespace|container"},
                    ],
                }
            ],
        },
    }
    return {
        "dcgm-exporter-servicemonitor.yaml": monitor,
        "kustomization.yaml": component(resources=["dcgm-exporter-servicemonitor.yaml"]),
    }


def vllm_component(s: KubeSettings) -> dict[str, Obj | list[Obj]]:
    """A PodMonitor of vLLM's pods in any namespace, as the vllm job, each target with
    its pod and namespace (the join to the GPU its pod holds)."""
    monitor = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": meta(s.vllm_job, "vllm"),
        "spec": {
            "namespaceSelector": {"any": True},
            "selector": {"matchLabels": dict(s.vllm_labels)},
            "podMetricsEndpoints": [
                {
                    "port": s.vllm_port,
                    "path": METRICS_PATH,
                    "interval": s.scrape_interval,
                    "relabelings": [
                        *relabelings(s.vllm_job),
                        # written out, though the Operator adds both too: a plain
                        # Prometheus scrape config copied from here keeps them
                        {
                            "action": "replace",
                            "sourceLabels": ["__meta_kubernetes_pod_name"],
                            "targetLabel": "pod",
                        },
                        {
                            "action": "replace",
                            "sourceLabels": ["__meta_kubernetes_namespace"],
                            "targetLabel": "namespace",
                        },
                    ],
                }
            ],
        },
    }
    return {
        "vllm-podmonitor.yaml": monitor,
        "kustomization.yaml": component(resources=["vllm-podmonitor.yaml"]),
    }


def spans_only_component(s: KubeSettings) -> dict[str, Obj | list[Obj]]:
    """The exporter taking spans only (``--gpu-source none``): no NVML, no GPU device,
    no NVIDIA runtime; the GPU side comes from dcgm-exporter."""
    spec = "/spec/template/spec"
    flags_patch = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": FLAGS_CONFIGMAP},
        "data": {"GPUSCOPE_GPU_SOURCE": "none"},
    }
    return {
        "kustomization.yaml": component(
            patches=[
                merge_patch(flags_patch),
                json_patch(
                    "DaemonSet",
                    EXPORTER,
                    [
                        # a flag, not only the ConfigMap: a patched ConfigMap cannot
                        # turn NVML back on
                        {
                            "op": "add",
                            "path": f"{spec}/containers/0/args/-",
                            "value": "--gpu-source=none",
                        },
                        {"op": "remove", "path": f"{spec}/runtimeClassName"},
                        # "void": where nvidia is the node's default runtime, the
                        # toolkit still mounts no GPU and no driver library
                        {
                            "op": "replace",
                            "path": f"{spec}/containers/0/env",
                            "value": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}],
                        },
                    ],
                ),
            ]
        )
    }


COMPONENTS: Final = {
    "kube-prometheus-stack": kube_prometheus_stack,
    "podmonitor": podmonitor_component,
    "secure": secure_component,
    "process-join": process_join_component,
    "host-port": host_port_component,
    "otel-collector": collector_component,
    "simulated-gpus": simulated_component,
    "worker": worker_component,
    "no-daemon": no_daemon_component,
    "dcgm-exporter": dcgm_exporter_component,
    "vllm": vllm_component,
    "spans-only": spans_only_component,
}

# overlay -> the components it adds to base/, in order (the release label last, so
# that it reaches the monitors the others add)
OVERLAYS: Final = {
    "kube-prometheus-stack": ("kube-prometheus-stack",),
    "podmonitor": ("podmonitor", "kube-prometheus-stack"),
    "secure": ("secure", "kube-prometheus-stack"),
    "process-join": ("process-join", "kube-prometheus-stack"),
    "host-port": ("host-port", "kube-prometheus-stack"),
    "collector": ("otel-collector", "kube-prometheus-stack"),
    "demo": ("simulated-gpus", "worker", "kube-prometheus-stack"),
    "no-daemon": ("no-daemon", "dcgm-exporter", "vllm", "kube-prometheus-stack"),
    "spans-only": ("spans-only", "dcgm-exporter", "kube-prometheus-stack"),
}


def overlay_namespace(s: KubeSettings, overlay: str) -> str:
    """The namespace of an overlay: a privileged one of its own for those whose
    components lower the Pod Security Standard (``lower_pod_security``)."""
    return s.privileged_namespace if overlay in PRIVILEGED_OVERLAYS else s.namespace


PRIVILEGED_OVERLAYS: Final = frozenset(("process-join", "host-port"))
