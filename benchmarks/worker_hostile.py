"""The worker against hostile inputs and SIGTERM, as an outside tester would try it.

Starts ``gpuscope worker`` (NumPy backend, tracing off) as a child process on
127.0.0.1 and measures:

* ``body``: huge request bodies (declared ``Content-Length`` and chunked) of
  ``--body-mib`` MiB: the status, the bytes the client got to send before the
  worker closed, the worker's peak RSS (VmHWM) before and after, and the slowest
  ``/healthz`` answered while the uploads ran;
* ``json``: bodies the JSON parser cannot take: status and time to answer;
* ``sigterm``: two long requests (a stream and a whole one) in flight, SIGTERM,
  then the answers they got and how long the process took to exit, against
  ``--shutdown-timeout-s``.

    .venv/bin/python benchmarks/worker_hostile.py [--body-mib 100 300] [--shutdown-timeout-s 2]
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from gpuscope.contract.http import HEALTHZ_PATH

MIB = 1024 * 1024
MODEL = "gpuscope-synthetic"


@contextlib.contextmanager
def worker(args: list[str]) -> Iterator[tuple[subprocess.Popen[str], str]]:
    command = [sys.executable, "-m", "gpuscope", "worker", "--port", "0", "--no-tracing"]
    process = subprocess.Popen(
        [*command, "--device", "cpu", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert process.stdout is not None
    url = ""
    for line in process.stdout:
        found = re.search(r"Uvicorn running on (http://\S+)", line)
        if found:
            url = found.group(1)
            break
    threading.Thread(target=process.stdout.read, daemon=True).start()  # keep draining
    try:
        yield process, url
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()


def peak_rss_mib(process: subprocess.Popen[str]) -> float:
    status = Path(f"/proc/{process.pid}/status").read_text()
    found = re.search(r"^VmHWM:\s+(\d+) kB", status, re.MULTILINE)
    assert found is not None
    return int(found.group(1)) / 1024


def upload(url: str, size: int, chunked: bool) -> tuple[int, int]:
    """(status, bytes sent before the worker stopped reading) for a ``size``-byte body."""
    host, port = url.removeprefix("http://").split(":")
    framing = "transfer-encoding: chunked" if chunked else f"content-length: {size}"
    head = f"POST /v1/embeddings HTTP/1.1\r\nhost: {host}\r\n{framing}\r\n\r\n".encode()
    sent = [0]
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(head)

        def send() -> None:
            piece = (b"%x\r\n" % MIB + b"1" * MIB + b"\r\n") if chunked else b"1" * MIB
            with contextlib.suppress(OSError):
                while sent[0] < size:
                    sock.sendall(piece)
                    sent[0] += MIB

        sender = threading.Thread(target=send)
        sender.start()
        response = http.client.HTTPResponse(sock)
        response.begin()
        response.read()
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        sender.join()
    return response.status, sent[0]


def bodies(sizes_mib: list[int]) -> None:
    with worker([]) as (process, url):
        httpx.post(f"{url}/v1/embeddings", json={"model": MODEL, "input": "warm"})
        before = peak_rss_mib(process)
        slowest = {"idle": 0.0, "uploading": 0.0}
        phase = ["idle"]
        stop = threading.Event()

        def probe() -> None:
            while not stop.is_set():
                started = time.perf_counter()
                httpx.get(f"{url}{HEALTHZ_PATH}", timeout=30)
                took = time.perf_counter() - started
                slowest[phase[0]] = max(slowest[phase[0]], took)

        prober = threading.Thread(target=probe)
        prober.start()
        time.sleep(2)  # the same probe with no upload running: the machine's own noise
        phase[0] = "uploading"
        for size in sizes_mib:
            for chunked in (False, True):
                status, sent = upload(url, size * MIB, chunked)
                framing = "chunked" if chunked else "content-length"
                print(
                    f"body {size} MiB {framing:>14}: {status}, client sent {sent / MIB:.0f} MiB "
                    f"before the close, peak RSS {peak_rss_mib(process):.1f} MiB"
                )
        stop.set()
        prober.join()
        idle_ms, busy_ms = slowest["idle"] * 1e3, slowest["uploading"] * 1e3
        print(f"peak RSS before the uploads {before:.1f} MiB")
        print(f"slowest /healthz: {idle_ms:.1f} ms idle (2 s), {busy_ms:.1f} ms during uploads")


def bombs() -> None:
    cases = {
        "5,000-digit integer": b'{"model": 1' + b"1" * 5000 + b"}",
        "100,000 nested [": b"[" * 100_000,
        "100,000 nested [ ]": b"[" * 100_000 + b"]" * 100_000,
    }
    with worker([]) as (_, url):
        for name, body in cases.items():
            started = time.perf_counter()
            answer = httpx.post(f"{url}/v1/completions", content=body, timeout=30)
            took = (time.perf_counter() - started) * 1e3
            kind = answer.json()["error"]["type"]
            print(f"json {name:>20}: {answer.status_code} {kind} in {took:.1f} ms")


def sigterm(timeout_s: float) -> None:
    args = ["--batching", "continuous", "--max-new-tokens", "4000", "--max-context", "4200"]
    args += ["--hidden-size", "512", "--shutdown-timeout-s", str(timeout_s)]
    with worker(args) as (process, url), httpx.Client(base_url=url, timeout=120) as client:
        body = {"model": MODEL, "prompt": "story", "max_tokens": 4000}
        outcome: dict[str, str] = {}

        def whole() -> None:
            answer = client.post("/v1/completions", json=body)
            outcome["whole"] = f"{answer.status_code} {answer.json().get('error', {}).get('code')}"

        def stream() -> None:
            events = []
            with client.stream("POST", "/v1/completions", json=body | {"stream": True}) as answer:
                for line in answer.iter_lines():
                    if line.startswith("data: "):
                        events.append(line[6:])
                        started.set()
            last = events[-1] if events[-1] == "[DONE]" else json.loads(events[-1])["error"]["code"]
            outcome["stream"] = f"{len(events) - 1} chunks, then {last}"

        started = threading.Event()
        threads = [threading.Thread(target=whole), threading.Thread(target=stream)]
        for thread in threads:
            thread.start()
        started.wait(60)
        signalled = time.perf_counter()
        process.send_signal(signal.SIGTERM)
        code = process.wait(120)
        exited = time.perf_counter() - signalled
        for thread in threads:
            thread.join()
    print(
        f"sigterm: exit {code} after {exited:.2f} s (--shutdown-timeout-s {timeout_s:g}); "
        f"whole request: {outcome['whole']}; stream: {outcome['stream']}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--body-mib", type=int, nargs="+", default=[100, 300])
    parser.add_argument("--shutdown-timeout-s", type=float, default=2.0)
    options = parser.parse_args()
    bodies(options.body_mib)
    bombs()
    sigterm(options.shutdown_timeout_s)


if __name__ == "__main__":
    main()
