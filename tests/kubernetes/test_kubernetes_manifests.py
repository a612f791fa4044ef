"""The manifests of deploy/kubernetes/: generated from the pack's tables, rendered by
kubectl's kustomize, valid for Kubernetes and the Prometheus Operator, rules promtool accepts."""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import re
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from alerts import build as alerts_build
from deploy.kubernetes import build, components, objects
from gpuscope import __version__, flags
from gpuscope.exporter.config import ExporterConfig
from gpuscope.worker.config import WorkerConfig
from pack import engines
from pack import settings as pack_settings
from pack.settings import RUNBOOK_PATH, RUNBOOK_URL_VARIABLE, KubeSettings, Settings, job_name
from support.binaries import require_binary
from support.kubernetes_manifests import (
    KUBERNETES,
    KUBERNETES_VERSION,
    REPO,
    Obj,
    crd_errors,
    crd_validators,
    find,
    kustomization_dirs,
    kustomize,
)

# starts child processes: not part of the fast tier (tests/support/fast_tier.py)
pytestmark = pytest.mark.processes

FOLDERS = kustomization_dirs()


def exporter_defaults() -> ExporterConfig:
    """The exporter's defaults, as its parser gives them without flags or environment."""
    return flags.parse(ExporterConfig, [], {}, exit_on_error=False)


def test_the_tables_runtime_values_are_the_exporters_and_workers_defaults() -> None:
    """The Kubernetes section of the pack's table writes the flags the manifests pass as
    values of its own (the builder imports the pack and the contract only): they are
    the parsers' defaults, and the image tag the version."""
    s = KubeSettings()
    exporter = exporter_defaults()
    worker = flags.parse(WorkerConfig, [], {}, exit_on_error=False)
    assert s.port == exporter.listen_address()[1]
    assert s.shutdown_timeout_s == exporter.shutdown_timeout_s
    assert s.gpu_source == exporter.gpu_source.value
    assert s.gpu_interval_s == exporter.gpu_interval_s
    assert s.max_series == exporter.max_series
    assert s.max_decompressed_bytes == exporter.max_decompressed_bytes
    assert s.max_ingest_bytes == exporter.max_ingest_bytes
    assert s.log_level == exporter.log_level
    assert s.worker_shutdown_timeout_s == worker.shutdown_timeout_s
    assert s.image_tag == __version__


def test_committed_manifests_are_what_the_builder_writes(tmp_path: Path) -> None:
    assert build.main(["--check"]) == 0, "stale: run 'make kubernetes'"
    for name, text in build.rendered().items():
        assert (KUBERNETES / name).read_text(encoding="utf-8") == text, name
    # --check also names a file the builder no longer writes
    out = tmp_path / "k8s"
    assert build.main(["--out", str(out)]) == 0
    assert build.main(["--out", str(out), "--check"]) == 0
    (out / "base" / "leftover.yaml").write_text("kind: ConfigMap\n")
    assert build.main(["--out", str(out), "--check"]) == 1
    (out / "overlays" / "demo" / "kustomization.yaml").write_text("# edited\n")
    assert build.main(["--out", str(out), "--check"]) == 1


def _runbook_urls(folder: Path) -> set[str]:
    """The runbook addresses (without their sections) of the PrometheusRule that
    ``kubectl kustomize`` renders from ``folder``."""
    kubectl = require_binary("kubectl")
    done = subprocess.run(
        [kubectl, "kustomize", str(folder)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    objects = [d for d in yaml.safe_load_all(done.stdout) if d is not None]
    groups = find(objects, "PrometheusRule")["spec"]["groups"]
    return {
        rule["annotations"]["runbook_url"].partition("#")[0]
        for group in groups
        for rule in group["rules"]
        if "alert" in rule
    }


def test_the_runbook_url_is_a_setting_of_the_manifests(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(RUNBOOK_URL_VARIABLE, raising=False)
    assert _runbook_urls(KUBERNETES / "overlays" / "demo") == {RUNBOOK_PATH}
    mine = "https://git.example.com/ops/gpuscope/blob/v1/alerts/runbook.md"
    assert build.main(["--out", str(tmp_path / "flag"), "--runbook-url", mine]) == 0
    assert _runbook_urls(tmp_path / "flag" / "overlays" / "kube-prometheus-stack") == {mine}
    # the committed manifests are the default's: --check says so when told another
    assert build.main(["--check", "--runbook-url", mine]) == 1
    monkeypatch.setenv(RUNBOOK_URL_VARIABLE, mine)
    assert build.main(["--out", str(tmp_path / "env")]) == 0
    assert _runbook_urls(tmp_path / "env" / "base") == {mine}


def test_every_overlay_and_component_is_rendered_here() -> None:
    # every component is used by an overlay, and every overlay is among FOLDERS
    used = {part for parts in components.OVERLAYS.values() for part in parts}
    assert used == set(components.COMPONENTS)
    assert {f"overlays/{name}" for name in components.OVERLAYS} == set(FOLDERS) - {"base"}


def test_the_prometheus_rule_holds_the_groups_alerts_build_writes() -> None:
    s = KubeSettings()
    rule = find(kustomize("base"), "PrometheusRule")
    groups = rule["spec"]["groups"]
    # the very groups of alerts/rules/*.yml, built from the same table ...
    expected = []
    for text in alerts_build.rendered(s.rules).values():
        expected += yaml.safe_load(text)["groups"]
    assert groups == expected
    # ... which differs from the shipped rules in the host of a target only
    assert s.rules == Settings(host_from_instance=s.rules.host_from_instance)
    shipped = []
    for name in ("recording.yml", "alerting.yml", "engines.yml", "dcgm-exporter.yml"):
        shipped += yaml.safe_load((REPO / "alerts" / "rules" / name).read_text())["groups"]
    assert [g["name"] for g in groups] == [g["name"] for g in shipped]
    assert [len(g["rules"]) for g in groups] == [len(g["rules"]) for g in shipped]


def test_the_prometheus_rule_follows_every_rule_setting_alerts_build_has_a_flag_for() -> None:
    """The builder takes its groups by running alerts/build.py with the flags of its
    table's ``rules``: one flag forgotten, and a table that changes that setting ships
    rules that ignore it."""
    jobs = {engine.source: f'job="my-{engine.source}"' for engine in engines.ENGINES}
    rules = dataclasses.replace(
        KubeSettings().rules,
        job_selector='job="my-gpuscope"',
        worker_job_selector='job="my-worker"',
        gpu_job_selector='job="my-gpus"',
        dcgm_job_selector='job="my-dcgm"',
        engine_jobs=KubeSettings().rules.engine_jobs.replace(**jobs),
        runbook="https://git.example.com/runbook.md",
        interval="10s",
        window="2m",
        for_override="1m",
    )
    s = dataclasses.replace(KubeSettings(), rules=rules)
    expected = []
    for text in alerts_build.rendered(rules).values():
        expected += yaml.safe_load(text)["groups"]
    assert objects.rule(s)["spec"]["groups"] == expected


def test_the_host_of_a_kubernetes_target_is_its_node() -> None:
    # What the relabelling writes into instance, read back by the rules' regex
    # (Prometheus anchors it, as fullmatch does).
    s = KubeSettings()
    monitor = find(kustomize("base"), "ServiceMonitor")
    relabel = monitor["spec"]["endpoints"][0]["relabelings"][1]
    meta = {
        "__meta_kubernetes_pod_node_name": "gpu-node-7",
        "__meta_kubernetes_pod_name": "gpuscope-x2k9f",
        "__address__": "10.244.3.17:9420",
    }
    joined = relabel["separator"].join(meta[label] for label in relabel["sourceLabels"])
    match = re.fullmatch(relabel["regex"], joined)
    assert match is not None
    instance = match.expand(relabel["replacement"].replace("$", "\\"))
    assert instance == "gpu-node-7/gpuscope-x2k9f:9420"
    for target, host in (
        (instance, "gpu-node-7"),
        ("gpu-node-7/vllm-0:8000", "gpu-node-7"),  # an engine pod on the same node
        ("gpu-host-1:9420", "gpu-host-1"),  # and what the shipped regex reads
        ("gpu-host-1", "gpu-host-1"),
        ("[::1]:9420", "[::1]"),
    ):
        found = re.fullmatch(s.rules.host_from_instance, target)
        assert found is not None and found.group(1) == host, target


def test_scrape_jobs_are_the_ones_the_rules_select() -> None:
    s = KubeSettings()
    objects = kustomize("overlays/demo")
    for monitor, selector in (
        (find(objects, "ServiceMonitor", "gpuscope"), s.rules.job_selector),
        (find(objects, "ServiceMonitor", "gpuscope-worker"), s.rules.worker_job_selector),
    ):
        relabel = monitor["spec"]["endpoints"][0]["relabelings"][0]
        assert relabel["targetLabel"] == "job"
        assert f'job="{relabel["replacement"]}"' == selector
    podmonitor = find(kustomize("overlays/podmonitor"), "PodMonitor")
    job = podmonitor["spec"]["podMetricsEndpoints"][0]["relabelings"][0]["replacement"]
    assert f'job="{job}"' == s.rules.job_selector
    with pytest.raises(ValueError, match="cannot name a scrape job"):
        job_name('job=~"gpu.*"')


def test_dashboards_are_configmaps_for_grafanas_sidecar() -> None:
    s = KubeSettings()
    objects = kustomize("overlays/kube-prometheus-stack")
    boards = sorted((REPO / "dashboards" / "json").glob("*.json"))
    assert boards
    for path in boards:
        configmap = find(objects, "ConfigMap", f"gpuscope-dashboard-{path.stem}")
        assert configmap["data"] == {path.name: path.read_text(encoding="utf-8")}
        assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert configmap["metadata"]["annotations"] == {"grafana_folder": "gpuscope"}
        json.loads(configmap["data"][path.name])
    # the Helm values tell kube-prometheus-stack's Grafana sidecar the same label and
    # annotation
    values = yaml.safe_load((KUBERNETES / "kube-prometheus-stack-values.yaml").read_text())
    sidecar = values["grafana"]["sidecar"]["dashboards"]
    assert (sidecar["label"], sidecar["labelValue"]) == s.dashboard_label
    assert sidecar["folderAnnotation"] == s.dashboard_folder_annotation
    assert sidecar["provider"]["foldersFromFilesStructure"] is True


def test_the_daemonset_follows_the_exporters_flags_and_stays_unprivileged() -> None:
    s = KubeSettings()
    defaults = exporter_defaults()
    daemonset = find(kustomize("overlays/kube-prometheus-stack"), "DaemonSet")
    pod = daemonset["spec"]["template"]["spec"]
    container = pod["containers"][0]
    args = container["args"]
    assert f"--shutdown-timeout-s={defaults.shutdown_timeout_s:g}" in args
    # the kubelet waits out the in-flight bound and the forwarder's drain, each up to
    # the shutdown timeout, before it kills the exporter
    assert pod["terminationGracePeriodSeconds"] > 2 * defaults.shutdown_timeout_s
    assert container["ports"][0]["containerPort"] == defaults.listen_address()[1]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    security = container["securityContext"]
    assert security["runAsNonRoot"] is True
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert "hostPID" not in pod and "hostNetwork" not in pod
    assert all("hostPort" not in p for p in container["ports"])
    assert pod["nodeSelector"] == dict(s.node_selector)
    assert pod["tolerations"][0]["key"] == "nvidia.com/gpu"
    # decoding one body at --max-decompressed-bytes fits under the memory limit
    limit = container["resources"]["limits"]["memory"]
    assert int(limit.removesuffix("Mi")) * 1024 * 1024 > 35 * defaults.max_decompressed_bytes
    service = find(kustomize("base"), "Service", s.exporter_job)
    assert service["spec"]["internalTrafficPolicy"] == "Local"
    namespace = find(kustomize("base"), "Namespace")
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    # only the components that need the host lower the namespace's standard, in a
    # namespace of their own (test_privileged_overlays_have_a_namespace_of_their_own)
    for folder, field in (("overlays/process-join", "hostPID"), ("overlays/host-port", None)):
        objects = kustomize(folder)
        pod = find(objects, "DaemonSet")["spec"]["template"]["spec"]
        if field:
            assert pod[field] is True
        else:
            assert pod["containers"][0]["ports"][0]["hostPort"] == s.port
        labels = find(objects, "Namespace")["metadata"]["labels"]
        assert labels["pod-security.kubernetes.io/enforce"] == "privileged"


def test_monitors_and_rules_carry_the_release_label_kube_prometheus_stack_selects() -> None:
    key, value = KubeSettings().release_label
    for folder in FOLDERS[1:]:
        for obj in kustomize(folder):
            if obj["kind"] in ("ServiceMonitor", "PodMonitor", "PrometheusRule"):
                assert obj["metadata"]["labels"][key] == value, (folder, obj["kind"])
    assert all(key not in o["metadata"].get("labels", {}) for o in kustomize("base"))


@pytest.mark.parametrize("folder", FOLDERS)
def test_rendered_objects_are_valid_for_kubernetes_and_the_operator(folder: str) -> None:
    objects = kustomize(folder)
    assert objects
    for obj in objects:
        where = f"{folder}: {obj['kind']} {obj['metadata']['name']}"
        if (obj["apiVersion"], obj["kind"]) in crd_validators():
            assert list(crd_errors(obj)) == [], where
        else:
            # raises on an unknown kind too, so that no object goes unchecked
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        if obj["kind"] != "Namespace":
            expected = components.overlay_namespace(KubeSettings(), folder.split("/")[-1])
            assert obj["metadata"]["namespace"] == expected, where


def test_the_validators_refuse_a_misspelt_field() -> None:
    # the checks above can fail: a typo in a core object and in a custom resource
    objects = kustomize("overlays/podmonitor")
    service = copy.deepcopy(find(objects, "Service"))
    service["spec"]["internalTraficPolicy"] = service["spec"].pop("internalTrafficPolicy")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(service, KUBERNETES_VERSION, strict=True)
    for kind in ("PodMonitor", "PrometheusRule"):
        obj = copy.deepcopy(find(objects, kind))
        assert list(crd_errors(obj)) == []
        if kind == "PodMonitor":
            obj["spec"]["podMetricsEndpoints"][0]["relabellings"] = []
        else:
            obj["spec"]["groups"][0]["rules"][0]["expression"] = "up"
        assert list(crd_errors(obj)) != [], kind


def _rules_file(obj: Obj, folder: Path) -> Path:
    path = folder / "rules.yml"
    path.write_text(yaml.safe_dump({"groups": obj["spec"]["groups"]}, sort_keys=False))
    return path


def test_promtool_accepts_the_rules_of_the_rendered_prometheus_rule(tmp_path: Path) -> None:
    promtool = require_binary("promtool")
    rule = find(kustomize("overlays/kube-prometheus-stack"), "PrometheusRule")
    path = _rules_file(rule, tmp_path)
    done = subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    count = sum(len(g["rules"]) for g in rule["spec"]["groups"])
    assert f"SUCCESS: {count} rules found" in done.stdout
    # and it refuses a broken expression, so the check above means something
    rule["spec"]["groups"][0]["rules"][0]["expr"] = "sum(("
    broken = subprocess.run(
        [promtool, "check", "rules", str(_rules_file(rule, tmp_path))],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert broken.returncode != 0


def test_the_readme_states_the_figures_the_table_gives() -> None:
    s = KubeSettings()
    readme = " ".join((KUBERNETES / "README.md").read_text(encoding="utf-8").split())
    assert (
        f"twice the timeout plus {pack_settings.SHUTDOWN_MARGIN_S} s ({s.grace_period_s} s)"
        in readme
    )
    assert f"the limit ({s.memory_limit_mib} Mi)" in readme
    assert f"--shutdown-timeout-s={s.shutdown_timeout_s:g}" in readme
    assert f"registry.example.com/gpuscope:{s.image_tag}" in readme


def test_kubernetes_schemas_need_no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    # CI and the development machines may have no route out: the schemas are bundled
    import socket

    def refuse(*args: object, **kwargs: object) -> None:
        raise OSError("no network in this test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    objects = kustomize("overlays/demo")
    for kind in ("DaemonSet", "Deployment", "Namespace"):
        obj = (
            find(objects, kind) if kind != "Deployment" else find(objects, kind, "gpuscope-worker")
        )
        assert kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True) == "1.32"


def _pods(objects: list[Obj]) -> list[tuple[str, Obj]]:
    """(name, pod spec) of every workload's pod template."""
    return [
        (obj["metadata"]["name"], obj["spec"]["template"]["spec"])
        for obj in objects
        if obj["kind"] in ("DaemonSet", "Deployment", "StatefulSet", "Job")
    ]


def _admitted(policy: Obj, namespace: dict[str, str], pod: dict[str, str], port: int) -> bool:
    """Whether one NetworkPolicy lets a pod (its namespace's labels, its own) reach ``port``."""

    def matches(selector: Obj | None, found: dict[str, str]) -> bool:
        wanted = (selector or {}).get("matchLabels", {})
        return all(found.get(k) == v for k, v in wanted.items())

    for rule in policy["spec"].get("ingress", []):
        if rule.get("ports") and all(p["port"] != port for p in rule["ports"]):
            continue
        for peer in rule.get("from", []):
            same_namespace = "namespaceSelector" not in peer
            if (
                same_namespace
                and namespace.get("kubernetes.io/metadata.name")
                != (policy["metadata"]["namespace"])
            ):
                continue
            if matches(peer.get("namespaceSelector"), namespace) and matches(
                peer.get("podSelector"), pod
            ):
                return True
    return False


@pytest.mark.parametrize("folder", FOLDERS)
def test_every_overlay_lets_only_senders_and_prometheus_reach_the_exporter(folder: str) -> None:
    """Before: no NetworkPolicy; any pod could post spans and burn another's SLO."""
    s = KubeSettings()
    objects = kustomize(folder)
    policies = [o for o in objects if o["kind"] == "NetworkPolicy"]
    if folder == "overlays/no-daemon":  # no exporter: nothing to guard
        assert policies == [] and _pods(objects) == []
        return
    exporter_labels = find(objects, "DaemonSet")["spec"]["template"]["metadata"]["labels"]
    guarding = [
        p
        for p in policies
        if all(
            exporter_labels.get(k) == v for k, v in p["spec"]["podSelector"]["matchLabels"].items()
        )
    ]
    assert len(guarding) == 1, folder
    (policy,) = guarding
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    sender = dict([s.span_sender_label])
    prometheus = dict([s.prometheus_pod_label])
    monitoring = {"kubernetes.io/metadata.name": s.prometheus_namespace}
    elsewhere = {"kubernetes.io/metadata.name": "tenant-a"}
    assert _admitted(policy, elsewhere, {"app": "vllm", **sender}, s.port)
    assert _admitted(policy, monitoring, prometheus, s.port)
    assert not _admitted(policy, elsewhere, {"app": "vllm"}, s.port)  # unlabelled pod
    assert not _admitted(policy, elsewhere, prometheus, s.port)  # not Prometheus's namespace
    assert not _admitted(policy, monitoring, {"app": "grafana"}, s.port)
    assert not _admitted(policy, elsewhere, sender, s.port + 1)  # another port
    # every pod of the pack that sends spans to the exporter carries the label
    for name, _ in _pods(objects):
        if name == "gpuscope-worker":
            template = find(objects, "Deployment", name)["spec"]["template"]
            assert _admitted(policy, elsewhere, template["metadata"]["labels"], s.port)
    if folder == "overlays/collector":  # and the Collector takes spans from exporters only
        collector = find(objects, "NetworkPolicy", "gpuscope-otel-collector")
        namespace = {"kubernetes.io/metadata.name": collector["metadata"]["namespace"]}
        assert _admitted(collector, namespace, exporter_labels, 4318)
        assert not _admitted(collector, elsewhere, exporter_labels, 4318)
        assert not _admitted(collector, namespace, {"app": "other"}, 4318)


def test_privileged_overlays_have_a_namespace_of_their_own() -> None:
    """Before: process-join and host-port lowered the gpuscope namespace to privileged."""
    s = KubeSettings()
    for folder in FOLDERS:
        objects = kustomize(folder)
        (namespace,) = [o for o in objects if o["kind"] == "Namespace"]
        level = namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"]
        name = namespace["metadata"]["name"]
        if level == "restricted":
            assert name == s.namespace, folder
            continue
        assert folder in ("overlays/process-join", "overlays/host-port"), folder
        assert (level, name) == ("privileged", s.privileged_namespace), folder
        # nothing but the exporter runs there
        assert [n for n, _ in _pods(objects)] == ["gpuscope"], folder
    assert s.privileged_namespace != s.namespace


def test_every_pod_runs_as_a_user_of_its_own() -> None:
    """Before: the hostPID exporter was uid 10001, as the worker and the Collector were."""
    users: dict[str, set[int]] = {}
    for folder in FOLDERS:
        for name, pod in _pods(kustomize(folder)):
            for container in pod["containers"]:
                uid = container["securityContext"]["runAsUser"]
                assert pod["securityContext"]["runAsUser"] == uid, (folder, name)
                assert container["securityContext"]["runAsGroup"] == uid, (folder, name)
                users.setdefault(name, set()).add(uid)
    assert set(users) == {"gpuscope", "gpuscope-worker", "gpuscope-otel-collector"}
    assert all(len(uids) == 1 for uids in users.values()), users
    every = [next(iter(uids)) for uids in users.values()]
    assert len(set(every)) == len(every), users


def _gpuscope_images(objects: list[Obj], image: str) -> dict[str, str]:
    """``workload/container`` -> image of every container (init ones too) running the
    gpuscope image, however it is tagged."""

    def name_of(reference: str) -> str:
        # the reference without its digest and tag (a registry's port stays)
        path, _, last = reference.split("@")[0].rpartition("/")
        return (path + "/" if path else "") + last.split(":")[0]

    return {
        f"{name}/{container['name']}": container["image"]
        for name, pod in _pods(objects)
        for container in (*pod.get("initContainers", ()), *pod["containers"])
        if name_of(container["image"]) == image
    }


@pytest.mark.parametrize("folder", FOLDERS)
def test_every_gpuscope_container_runs_the_one_tagged_version(folder: str) -> None:
    # an images: entry reaches only the objects of its own kustomization and those below
    # it: base's did not reach the containers a component adds (the demo's worker)
    s = KubeSettings()
    images = _gpuscope_images(kustomize(folder), s.image)
    if folder == "overlays/no-daemon":
        assert images == {}
        return
    assert images, f"{folder} runs no gpuscope container"
    assert set(images.values()) == {f"{s.image}:{s.image_tag}"}, images


def test_one_images_entry_of_a_users_overlay_retags_every_gpuscope_container(
    tmp_path: Path,
) -> None:
    # the README's own overlay: its one entry moves the exporter and the worker alike
    kubectl = require_binary("kubectl")
    s = KubeSettings()
    overlay = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        # kustomize refuses an absolute path
        "resources": [os.path.relpath(KUBERNETES / "overlays" / "demo", tmp_path)],
        "images": [
            {"name": s.image, "newName": "registry.example.com/gpuscope", "newTag": "9.9.9"}
        ],
    }
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(overlay), encoding="utf-8")
    done = subprocess.run(
        [kubectl, "kustomize", str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    objects = [d for d in yaml.safe_load_all(done.stdout) if d is not None]
    images = _gpuscope_images(objects, "registry.example.com/gpuscope")
    assert set(images) == {"gpuscope/exporter", "gpuscope-worker/worker"}, images
    assert set(images.values()) == {"registry.example.com/gpuscope:9.9.9"}


WORKLOADS = frozenset(
    ("Pod", "DaemonSet", "Deployment", "StatefulSet", "ReplicaSet", "Job", "CronJob")
)


def _selects(selector: str, job: str) -> bool:
    """Whether a ``job="x"`` or ``job=~"re"`` selector of the rules selects ``job``."""
    match = re.fullmatch(r'job(=~?)"([^"]+)"', selector)
    assert match is not None, selector
    op, value = match.groups()
    return re.fullmatch(value, job) is not None if op == "=~" else value == job


def _relabel(rules: list[Obj], meta: dict[str, str]) -> dict[str, str]:
    """Prometheus's target relabelling of ``replace`` and ``labeldrop`` rules (the two
    the monitors use) over a target's labels; ``__meta_*`` go after it, as there."""
    labels = dict(meta)
    for rule in rules:
        action = rule.get("action", "replace")
        regex = rule.get("regex", "(.*)")
        if action == "labeldrop":
            labels = {k: v for k, v in labels.items() if not re.fullmatch(regex, k)}
            continue
        assert action == "replace", rule
        joined = rule.get("separator", ";").join(
            labels.get(name, "") for name in rule.get("sourceLabels", [])
        )
        found = re.fullmatch(regex, joined)
        if found is not None:
            replacement = rule.get("replacement", "$1")
            labels[rule["targetLabel"]] = found.expand(re.sub(r"\$(\d)", r"\\\1", replacement))
    return {k: v for k, v in labels.items() if not k.startswith("__")}


def test_the_no_daemon_overlay_ships_rules_boards_and_scrapes_only() -> None:
    """Before: every overlay ran gpuscope's exporter on every GPU node."""
    s = KubeSettings()
    objects = kustomize("overlays/no-daemon")
    assert [o for o in objects if o["kind"] in WORKLOADS] == []
    assert {o["kind"] for o in objects} == {
        "Namespace",
        "PrometheusRule",
        "ConfigMap",
        "ServiceMonitor",
        "PodMonitor",
    }
    # every rule group, dcgm-exporter's included, as base ships them
    groups = find(objects, "PrometheusRule")["spec"]["groups"]
    assert groups == find(kustomize("base"), "PrometheusRule")["spec"]["groups"]
    dcgm = yaml.safe_load((REPO / "alerts" / "rules" / "dcgm-exporter.yml").read_text())
    assert {g["name"] for g in dcgm["groups"]} <= {g["name"] for g in groups}
    # every dashboard, and no other ConfigMap
    boards = {f"gpuscope-dashboard-{p.stem}" for p in (REPO / "dashboards" / "json").glob("*.json")}
    assert {o["metadata"]["name"] for o in objects if o["kind"] == "ConfigMap"} == boards
    # the two scrapes, under the jobs the rules select
    (monitor,) = [o for o in objects if o["kind"] == "ServiceMonitor"]
    assert monitor["metadata"]["name"] == s.dcgm_exporter_service
    (podmonitor,) = [o for o in objects if o["kind"] == "PodMonitor"]
    assert podmonitor["metadata"]["name"] == s.vllm_job
    assert _selects(s.rules.engine_jobs[engines.VLLM], s.vllm_job)


def test_dcgm_exporters_scrape_keeps_the_gpus_holder_pod_and_names_the_node() -> None:
    s = KubeSettings()
    monitor = find(kustomize("overlays/no-daemon"), "ServiceMonitor", s.dcgm_exporter_service)
    spec = monitor["spec"]
    # the GPU Operator's Service: its namespace, label and port name
    assert spec["namespaceSelector"] == {"matchNames": ["gpu-operator"]}
    assert spec["selector"] == {"matchLabels": {"app": "nvidia-dcgm-exporter"}}
    (endpoint,) = spec["endpoints"]
    assert endpoint["port"] == "gpu-metrics"
    # what the Prometheus Operator puts on a ServiceMonitor's target before the
    # monitor's own relabelings (the pod is dcgm-exporter's)
    target = {
        "__meta_kubernetes_pod_node_name": "gpu-node-1",
        "__meta_kubernetes_pod_name": "nvidia-dcgm-exporter-7xk2p",
        "__address__": "10.244.1.9:9400",
        "namespace": "gpu-operator",
        "pod": "nvidia-dcgm-exporter-7xk2p",
        "container": "nvidia-dcgm-exporter",
        "service": "nvidia-dcgm-exporter",
        "endpoint": "gpu-metrics",
        "job": "nvidia-dcgm-exporter",
    }
    labels = _relabel(endpoint["relabelings"], target)
    # no pod, namespace or container of its own: a scraped series keeps the holder's
    # (dcgm-exporter writes them on a held GPU's series only)
    assert labels == {
        "job": s.dcgm_exporter_service,
        "instance": "gpu-node-1/nvidia-dcgm-exporter-7xk2p:9400",
        "service": "nvidia-dcgm-exporter",
        "endpoint": "gpu-metrics",
    }
    assert _selects(s.rules.dcgm_job_selector, labels["job"])
    assert _selects(s.rules.gpu_job_selector, labels["job"])
    host = re.fullmatch(s.rules.host_from_instance, labels["instance"])
    assert host is not None and host.group(1) == "gpu-node-1"


def test_vllms_scrape_carries_its_pod_and_node() -> None:
    s = KubeSettings()
    podmonitor = find(kustomize("overlays/no-daemon"), "PodMonitor", s.vllm_job)
    assert podmonitor["spec"]["namespaceSelector"] == {"any": True}
    assert podmonitor["spec"]["selector"] == {"matchLabels": dict(s.vllm_labels)}
    (endpoint,) = podmonitor["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] == s.vllm_port
    target = {
        "__meta_kubernetes_pod_node_name": "gpu-node-1",
        "__meta_kubernetes_pod_name": "vllm-llama-0",
        "__meta_kubernetes_namespace": "inference",
        "__address__": "10.244.1.23:8000",
    }
    labels = _relabel(endpoint["relabelings"], target)
    assert labels == {
        "job": "vllm",
        "instance": "gpu-node-1/vllm-llama-0:8000",
        "pod": "vllm-llama-0",
        "namespace": "inference",
    }
    assert _selects(s.rules.engine_jobs[engines.VLLM], labels["job"])


def test_the_spans_only_exporter_takes_no_gpu_and_nothing_privileged() -> None:
    """Before: every exporter opened NVML, through the NVIDIA runtime and every GPU."""
    objects = kustomize("overlays/spans-only")
    daemonset = find(objects, "DaemonSet", "gpuscope")
    pod = daemonset["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert "--gpu-source=none" in container["args"]
    assert (
        find(objects, "ConfigMap", "gpuscope-exporter-flags")["data"]["GPUSCOPE_GPU_SOURCE"]
        == "none"
    )
    assert "runtimeClassName" not in pod
    assert container["env"] == [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]
    assert all("hostPath" not in v for v in pod["volumes"])
    assert "volumeDevices" not in container
    for key in ("hostPID", "hostNetwork", "hostIPC"):
        assert key not in pod
    security = container["securityContext"]
    assert security.get("privileged", False) is False
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    resources = container["resources"]
    assert not any("nvidia.com" in k for part in resources.values() for k in part)
    # it stays in the restricted namespace, beside dcgm-exporter's scrape
    labels = find(objects, "Namespace")["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    find(objects, "ServiceMonitor", KubeSettings().dcgm_exporter_service)
    # and the base's exporter still reads the GPUs (the patch is the overlay's only)
    base_pod = find(kustomize("base"), "DaemonSet")["spec"]["template"]["spec"]
    assert "--gpu-source=none" not in base_pod["containers"][0]["args"]
    assert base_pod["runtimeClassName"] == KubeSettings().runtime_class


def test_the_readme_lists_every_overlay_with_its_components() -> None:
    readme = (KUBERNETES / "README.md").read_text(encoding="utf-8")
    rows = {}
    for line in readme.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| `") and len(cells) == 3:
            rows[cells[0].strip("`")] = tuple(c.strip().strip("`") for c in cells[1].split(","))
    for overlay, parts in components.OVERLAYS.items():
        assert rows.get(overlay) == parts, overlay
