"""``gpuscope exporter`` started with exactly what the rendered DaemonSet gives its
container (args, the flags ConfigMap, env, the files of its volumes), probed as the
kubelet probes it and scraped as its ServiceMonitor scrapes it.

What cannot exist here is substituted, and only that: the pod's address (``--listen``
on every interface of the pod becomes a free loopback port), the mount paths (each
volume's files are written under a temporary folder and the paths that point into
it follow), and the TLS Secret the secure overlay expects from the cluster (a
certificate made here for the name the ServiceMonitor checks).
"""

from __future__ import annotations

import base64
import http.client
import os
import secrets
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import bcrypt
import pytest

from gpuscope.exporter.http import placeholders
from support.binaries import require_binary
from support.kubernetes_manifests import Obj, find, kustomize, secret_data

# starts child processes: not part of the fast tier (tests/support/fast_tier.py)
pytestmark = pytest.mark.processes

GPUSCOPE = Path(sys.executable).with_name("gpuscope")
# The first GPU poll (the simulated source's) comes within a second; the machine may be
# loaded.
READY_WITHIN_S = 30.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def make_tls_secret(folder: Path, server_name: str) -> dict[str, str]:
    """What cert-manager would put in the TLS Secret: a certificate for ``server_name``
    (self-signed, so it is its own CA), its key and the CA."""
    openssl = require_binary("openssl")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        [
            openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            "-subj", f"/CN={server_name}", "-addext", f"subjectAltName=DNS:{server_name}",
            "-keyout", str(key), "-out", str(cert),
        ],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return {"tls.crt": cert.read_text(), "tls.key": key.read_text(), "ca.crt": cert.read_text()}


def volume_files(
    objects: list[Obj], volume: Obj, extra: dict[str, dict[str, str]]
) -> dict[str, str]:
    """Relative path -> content of a volume's files, from the rendered Secrets and
    ConfigMaps (``extra``: Secrets the cluster, not the manifests, provides)."""

    def source(kind: str, name: str) -> dict[str, str]:
        if kind == "Secret":
            return extra[name] if name in extra else secret_data(objects, name)
        data: dict[str, str] = find(objects, "ConfigMap", name).get("data", {})
        return data

    files: dict[str, str] = {}
    sources = volume["projected"]["sources"] if "projected" in volume else [volume]
    for src in sources:
        kind = "Secret" if "secret" in src else "ConfigMap"
        ref = src["secret"] if kind == "Secret" else src["configMap"]
        name = ref.get("name") or ref["secretName"]
        data = source(kind, name)
        items = ref.get("items") or [{"key": k, "path": k} for k in data]
        for item in items:
            files[item["path"]] = data[item["key"]]
    return files


@dataclass
class Started:
    process: subprocess.Popen[bytes]
    port: int
    container: Obj
    pod: Obj
    objects: list[Obj]
    root: Path


def start_as_the_daemonset(overlay: str, root: Path, extra: dict[str, dict[str, str]]) -> Started:
    objects = kustomize(overlay)
    pod = find(objects, "DaemonSet")["spec"]["template"]["spec"]
    (container,) = [c for c in pod["containers"] if c["name"] == "exporter"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts: dict[str, Path] = {}
    for mount in container["volumeMounts"]:
        here = root / mount["mountPath"].lstrip("/")
        here.mkdir(parents=True, exist_ok=True)
        volume = volumes[mount["name"]]
        if "emptyDir" not in volume:
            for rel, content in volume_files(objects, volume, extra).items():
                (here / rel).write_text(content)
        mounts[mount["mountPath"]] = here

    def local(value: str) -> str:
        """A path into a mounted volume, pointed at its local copy (once)."""
        flag, sep, path = value.rpartition("=")
        for mounted, there in mounts.items():
            if path.startswith(mounted + "/"):
                return flag + sep + str(there) + path.removeprefix(mounted)
        return value

    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUSCOPE_")}
    for ref in container.get("envFrom", []):
        env.update(find(objects, "ConfigMap", ref["configMapRef"]["name"])["data"])
    for item in container.get("env", []):
        env[item["name"]] = item["value"]  # valueFrom would need a cluster: none is used
    env = {k: local(v) for k, v in env.items()}
    port = free_port()
    args = []
    for arg in container["args"]:
        if arg.startswith("--listen="):
            # the pod's every interface, on this machine: a loopback port
            assert arg == f"--listen=:{container['ports'][0]['containerPort']}"
            arg = f"--listen=127.0.0.1:{port}"
        args.append(local(arg))
    assert args[0] == "exporter"  # the image's entrypoint is the gpuscope command
    process = subprocess.Popen(
        [str(GPUSCOPE), *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    return Started(process, port, container, pod, objects, root)


@pytest.fixture
def started() -> Iterator[list[Started]]:
    running: list[Started] = []
    yield running
    for one in running:
        if one.process.poll() is None:
            one.process.kill()
            one.process.wait()
        if one.process.stdout is not None:
            one.process.stdout.close()


class _Connection(http.client.HTTPSConnection):
    """HTTPS to 127.0.0.1, checking the certificate against another name (a
    ServiceMonitor's ``serverName``, as Prometheus does when it scrapes a pod IP)."""

    def __init__(self, port: int, server_name: str | None, context: ssl.SSLContext) -> None:
        super().__init__("127.0.0.1", port, context=context, timeout=10)
        self.server_name = server_name
        self.tls = context

    def connect(self) -> None:
        sock = socket.create_connection((self.host, self.port), self.timeout)
        self.sock = self.tls.wrap_socket(sock, server_hostname=self.server_name)


def get(
    port: int,
    path: str,
    scheme: str,
    *,
    context: ssl.SSLContext | None = None,
    server_name: str | None = None,
    headers: dict[str, str] | None = None,
    method: str = "GET",
    body: bytes | None = None,
) -> tuple[int, str]:
    connection: http.client.HTTPConnection
    if scheme.upper() == "HTTPS":
        assert context is not None
        connection = _Connection(port, server_name, context)
    else:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        return response.status, response.read().decode("utf-8", "replace")
    finally:
        connection.close()


def kubelet_context() -> ssl.SSLContext:
    # the kubelet's HTTPS probes do not verify the certificate
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def probe(one: Started, which: str) -> tuple[int, str]:
    http_get = one.container[which]["httpGet"]
    assert http_get["port"] == one.container["ports"][0]["name"]
    return get(one.port, http_get["path"], http_get["scheme"], context=kubelet_context())


def wait_ready(one: Started) -> None:
    deadline = time.monotonic() + READY_WITHIN_S
    while True:
        assert one.process.poll() is None, output(one)
        try:
            status, _ = probe(one, "readinessProbe")
            if status == 200:
                return
        except OSError:
            pass  # not listening yet
        assert time.monotonic() < deadline, "not ready in time:\n" + output(one)
        time.sleep(0.1)


def output(one: Started) -> str:
    if one.process.poll() is None:
        return "(still running)"
    assert one.process.stdout is not None
    return one.process.stdout.read().decode("utf-8", "replace")


def stops_within_the_grace_period(one: Started) -> None:
    began = time.monotonic()
    one.process.send_signal(signal.SIGTERM)
    code = one.process.wait(timeout=one.pod["terminationGracePeriodSeconds"])
    assert code == 0, output(one)
    assert time.monotonic() - began < one.pod["terminationGracePeriodSeconds"]


def basic(user: str, password: str) -> dict[str, str]:
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


@pytest.mark.parametrize(
    "overlay", ["base", "overlays/demo", "overlays/collector", "overlays/spans-only"]
)
def test_the_exporter_serves_with_the_daemonsets_arguments(
    overlay: str, tmp_path: Path, started: list[Started]
) -> None:
    one = start_as_the_daemonset(overlay, tmp_path, {})
    started.append(one)
    wait_ready(one)
    assert probe(one, "livenessProbe") == (200, "ok\n")
    endpoint = find(one.objects, "ServiceMonitor", "gpuscope")["spec"]["endpoints"][0]
    assert endpoint.get("scheme", "http") == "http"
    status, text = get(one.port, endpoint["path"], "http")
    assert status == 200
    assert "gpuscope_build_info{" in text
    flags = find(one.objects, "ConfigMap", "gpuscope-exporter-flags")["data"]
    if "--gpu-source=none" in one.container["args"]:
        # spans only: no GPU opened, none served (dcgm-exporter serves the GPUs)
        assert 'gpuscope_gpu_source_info{requested="none",source="none"} 1.0' in text
        assert "gpuscope_gpu_up" not in text
    if flags["GPUSCOPE_GPU_SOURCE"] == "simulated":
        # the demo's simulated GPU is the one its worker names on its spans
        worker = find(one.objects, "Deployment", "gpuscope-worker")
        (uuid,) = [
            a.split("=", 1)[1]
            for a in worker["spec"]["template"]["spec"]["containers"][0]["args"]
            if a.startswith("--gpu-uuid=")
        ]
        assert f'uuid="{uuid}"' in text
    stops_within_the_grace_period(one)


def own_credentials(objects: list[Obj]) -> dict[str, dict[str, str]]:
    """Secrets as an operator replaces the secure component's: a password of their own
    (its bcrypt hash in the web config) and a random token."""
    password = secrets.token_urlsafe(16)
    hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=4)).decode()
    web_config = secret_data(objects, "gpuscope-web-config")["web-config.yml"]
    shipped = secret_data(objects, "gpuscope-scrape-auth")
    assert placeholders.EXAMPLE_HASH in web_config
    return {
        "gpuscope-web-config": {
            "web-config.yml": web_config.replace(placeholders.EXAMPLE_HASH, hashed)
        },
        "gpuscope-scrape-auth": {"username": shipped["username"], "password": password},
        "gpuscope-otlp-token": {"token": secrets.token_hex(32)},
    }


def test_the_secure_overlay_refuses_to_start_with_its_placeholders(
    tmp_path: Path, started: list[Started]
) -> None:
    """Before: the shipped example hash and token were accepted without a word."""
    objects = kustomize("overlays/secure")
    server_name = find(objects, "ServiceMonitor", "gpuscope")["spec"]["endpoints"][0]["tlsConfig"][
        "serverName"
    ]
    cluster_tls = make_tls_secret(tmp_path, server_name)
    own = own_credentials(objects)
    for replaced, named in (
        ({}, "basic_auth_users.prometheus is the example hash"),
        ({"gpuscope-web-config": own["gpuscope-web-config"]}, "the token is the example"),
    ):
        root = tmp_path / f"root-{len(replaced)}"
        one = start_as_the_daemonset(
            "overlays/secure", root, {"gpuscope-tls": cluster_tls, **replaced}
        )
        started.append(one)
        code = one.process.wait(timeout=READY_WITHIN_S)
        text = output(one)
        assert code == 2, text
        assert named in text, text


def test_the_secure_overlay_serves_tls_and_guards_scrapes_and_spans(
    tmp_path: Path, started: list[Started]
) -> None:
    objects = kustomize("overlays/secure")
    endpoint = find(objects, "ServiceMonitor", "gpuscope")["spec"]["endpoints"][0]
    tls = endpoint["tlsConfig"]
    server_name = tls["serverName"]
    cluster_tls = make_tls_secret(tmp_path, server_name)
    # the operator's own credentials in place of the component's placeholders
    own = own_credentials(objects)
    one = start_as_the_daemonset(
        "overlays/secure", tmp_path / "root", {"gpuscope-tls": cluster_tls, **own}
    )
    started.append(one)
    wait_ready(one)  # the probes need no credentials
    assert probe(one, "livenessProbe") == (200, "ok\n")

    # scraped as the ServiceMonitor says: https, the CA from the TLS Secret, the name
    # it checks, the credentials of the scrape-auth Secret
    assert endpoint["scheme"] == "https"
    context = ssl.create_default_context(cadata=cluster_tls[tls["ca"]["secret"]["key"]])
    auth = endpoint["basicAuth"]
    user = own[auth["username"]["name"]][auth["username"]["key"]]
    password = own[auth["password"]["name"]][auth["password"]["key"]]

    def scrape(headers: dict[str, str]) -> tuple[int, str]:
        return get(
            one.port,
            endpoint["path"],
            "https",
            context=context,
            server_name=server_name,
            headers=headers,
        )

    assert scrape({})[0] == 401
    assert scrape(basic(user, "wrong"))[0] == 401
    status, text = scrape(basic(user, password))
    assert status == 200
    assert "gpuscope_build_info{" in text
    with pytest.raises(ssl.SSLCertVerificationError):
        get(one.port, "/metrics", "https", context=context, server_name="other.example")

    # spans need the token of the OTLP token Secret
    token = own["gpuscope-otlp-token"]["token"]
    empty = {"Content-Type": "application/x-protobuf"}

    def export(headers: dict[str, str]) -> int:
        status, _ = get(
            one.port,
            "/v1/traces",
            "https",
            context=context,
            server_name=server_name,
            headers={**empty, **headers},
            method="POST",
            body=b"",
        )
        return status

    assert export({}) == 401
    assert export({"Authorization": f"Bearer {token}"}) == 200
    stops_within_the_grace_period(one)


def test_the_demo_workers_spans_reach_the_exporter_with_its_gpu(
    tmp_path: Path, started: list[Started]
) -> None:
    exporter = start_as_the_daemonset("overlays/demo", tmp_path, {})
    started.append(exporter)
    objects = exporter.objects
    pod = find(objects, "Deployment", "gpuscope-worker")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    service = find(objects, "Service", "gpuscope")
    service_url = (
        f"http://{service['metadata']['name']}.{service['metadata']['namespace']}.svc:"
        f"{service['spec']['ports'][0]['port']}/v1/traces"
    )
    port = free_port()
    args = []
    for arg in container["args"]:
        if arg.startswith("--host="):  # the pod's every interface: loopback here
            arg = "--host=127.0.0.1"
        elif arg.startswith("--port="):
            assert arg == f"--port={container['ports'][0]['containerPort']}"
            arg = f"--port={port}"
        elif arg.startswith("--otlp-endpoint="):
            # the exporter's Service (on the worker's own node): the one started here
            assert arg == f"--otlp-endpoint={service_url}"
            arg = f"--otlp-endpoint=http://127.0.0.1:{exporter.port}/v1/traces"
        args.append(arg)
    assert args[0] == "worker"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUSCOPE_", "OTEL_"))}
    process = subprocess.Popen(
        [str(GPUSCOPE), *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    worker = Started(process, port, container, pod, objects, tmp_path)
    started.append(worker)
    wait_ready(exporter)
    wait_ready(worker)
    body = b'{"model": "gpuscope-synthetic", "input": "where did the time go"}'
    status, _ = get(
        port,
        "/v1/embeddings",
        "http",
        method="POST",
        body=body,
        headers={"Content-Type": "application/json"},
    )
    assert status == 200
    (uuid,) = [a.split("=", 1)[1] for a in args if a.startswith("--gpu-uuid=")]
    deadline = time.monotonic() + READY_WITHIN_S
    while True:  # the worker exports its spans in the background
        _, text = get(exporter.port, "/metrics", "http")
        lines = [
            line
            for line in text.splitlines()
            if line.startswith("gpuscope_request_duration_seconds_count{")
            and f'uuid="{uuid}"' in line
        ]
        if lines:
            break
        assert time.monotonic() < deadline, "no span reached the exporter:\n" + text[-2000:]
        time.sleep(0.2)
    assert 'service="gpuscope-worker"' in lines[0]
    stops_within_the_grace_period(worker)
    stops_within_the_grace_period(exporter)
