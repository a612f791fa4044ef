"""``gpuscope loadgen`` and ``gpuscope tune`` as commands: real processes, real servers,
their files, Ctrl-C, and no process left behind."""

from __future__ import annotations

import asyncio
import contextlib
import csv
import importlib.util
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from gpuscope import extras, flags
from gpuscope.loadgen import cli, record
from support.gpuscope_processes import GPUSCOPE, gpuscope_processes
from support.worker_servers import serve_worker

# starts child processes: not part of the fast tier (tests/support/fast_tier.py)
pytestmark = pytest.mark.processes

SMALL_WORKER = "--hidden-size 64 --layers 1"


def wait_for(condition: object, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            pytest.fail(f"{what} did not happen within {timeout_s:.0f} s")
        time.sleep(0.1)  # another process's progress gives no event to wait on


@pytest.fixture
def worker_url() -> Iterator[str]:
    with serve_worker() as url:
        yield url


def completed(worker_url: str) -> int:
    async def read() -> int:
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"{worker_url}/healthz") as reply,
        ):
            body = await reply.json()
        return int(body["embeddings"]["completed"] + body["completions"]["completed"])

    return asyncio.run(read())


def test_loadgen_writes_json_csv_record_and_plot(worker_url: str, tmp_path: Path) -> None:
    argv = ["loadgen", "--url", f"{worker_url}/v1", "--concurrency", "1,3", "--requests", "6"]
    argv += ["--warmup-s", "0", "--json", "-", "--csv", str(tmp_path / "steps.csv")]
    argv += ["--record", str(tmp_path / "record.md"), "--plot", str(tmp_path / "steps.png")]
    argv += ["--label", "defaults"]
    done = subprocess.run([*GPUSCOPE, *argv], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)  # the table went to standard error
    assert [(s["load"]["value"], s["sent"], s["ok"]) for s in report["steps"]] == [
        (1, 6, 6),
        (3, 6, 6),
    ]
    rows = record.read_record((tmp_path / "record.md").read_text())
    steps = [(r["config"], r["load"], r["ok"]) for r in rows]
    assert steps == [("defaults", "c=1", "6"), ("defaults", "c=3", "6")]
    with (tmp_path / "steps.csv").open() as handle:
        assert [r["p99 ms"] for r in csv.DictReader(handle)] == [r["p99 ms"] for r in rows]
    assert (tmp_path / "steps.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "p99 ms" in done.stderr  # the end table


def test_loadgen_ctrl_c_stops_and_prints_what_was_measured(worker_url: str) -> None:
    before = completed(worker_url)
    argv = ["loadgen", "--url", f"{worker_url}/v1", "--concurrency", "2,4", "--duration-s", "120"]
    process = subprocess.Popen(
        [*GPUSCOPE, *argv, "--warmup-s", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        wait_for(lambda: completed(worker_url) - before >= 5, "five requests served")
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 130, err
    assert "stopped (Ctrl-C, SIGTERM or SIGHUP)" in err
    assert "c=2 (stopped)" in out  # the step it was in, with what it measured
    assert "c=4" not in out


def test_loadgen_unreachable_url_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    from gpuscope.children import free_port

    url = f"http://127.0.0.1:{free_port()}/v1"
    assert cli.main(["--url", url, "--concurrency", "1", "--requests", "1"]) == 1
    assert f"cannot read {url}/models" in capsys.readouterr().err


def test_plot_without_matplotlib_is_refused_before_any_load(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "matplotlib" else real(name, *a),
    )
    monkeypatch.setattr(extras, "installed_from_directory", lambda record: "/src/gpuscope")
    assert cli.main(["--plot", str(tmp_path / "x.png"), "--url", "http://127.0.0.1:9/v1"]) == 2
    assert "pip install '/src/gpuscope[plot]'" in capsys.readouterr().err


def test_tune_sweeps_two_values_names_the_best_and_leaves_no_process(tmp_path: Path) -> None:
    before = gpuscope_processes()
    argv = ["tune", "--sweep", "max-batch-size=1,4", "--concurrency", "4", "--requests", "12"]
    argv += ["--warmup-s", "0", "--record", str(tmp_path / "record.md")]
    argv += ["--objective", "max throughput with p99 <= 60000 ms", "--worker-args", SMALL_WORKER]
    done = subprocess.run([*GPUSCOPE, *argv], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    assert "best under 'max throughput with p99 <= 60000 ms': max-batch-size=" in done.stdout
    assert "where the time went" in done.stdout
    # the winner as Triton's and Ray Serve's batching settings
    assert "dynamic_batching { preferred_batch_size: [ " in done.stdout
    assert "@serve.batch(max_batch_size=" in done.stdout
    rows = record.read_record((tmp_path / "record.md").read_text())
    assert [(r["config"], r["ok"]) for r in rows] == [
        ("max-batch-size=1", "12"), ("max-batch-size=4", "12")
    ]  # fmt: skip
    assert all(r["compute ms"] and r["batch"] for r in rows)  # the exporter's side is there
    assert float(rows[0]["batch"]) == 1.0
    assert gpuscope_processes() - before == set()


# SIGTERM is what a supervisor, `timeout` or `kill` sends, SIGHUP a closed terminal: neither
# may orphan the children (they run in sessions of their own, out of the terminal's reach).
@pytest.mark.parametrize("stop_signal", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_tune_ctrl_c_stops_every_process_it_started(stop_signal: signal.Signals) -> None:
    before = gpuscope_processes()
    argv = ["tune", "--sweep", "max-queue-delay-ms=1,2", "--concurrency", "2"]
    argv += ["--duration-s", "120", "--worker-args", SMALL_WORKER]
    process = subprocess.Popen(
        [*GPUSCOPE, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        # the tuner, its exporter and its first worker
        wait_for(lambda: len(gpuscope_processes() - before) >= 3, "exporter and worker started")
        process.send_signal(stop_signal)
        _, err = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 130, err
    assert gpuscope_processes() - before == set()


def test_tune_arguments_are_checked() -> None:
    from gpuscope.loadgen.tune import TuneOptions

    assert flags.parse(TuneOptions, ["--sweep", "batching=none,dynamic"], {}).values() == [
        "none",
        "dynamic",
    ]
    env = {"GPUSCOPE_TUNE_SWEEP": "max-batch-size=2,8"}
    assert flags.parse(TuneOptions, [], env).label("8") == "max-batch-size=8"
    for argv in (
        ["--sweep", "port=1,2"],  # the tuner's own flag
        ["--sweep", "max-batch-size=4"],  # nothing to compare
        ["--sweep", "max-batch-size=0,4"],  # the worker refuses 0
        ["--sweep", "warp-speed=1,2"],
        ["--objective", "min p99 at rate 50", "--rate", "10,20"],
        ["--worker-args", "--no-such-flag"],
        ["--worker-args", "--port 8000"],  # the tuner picks the port
        # The same flags in the forms argparse also takes: =value, an abbreviation.
        ["--worker-args", "--port=8000"],
        ["--worker-args", "--po 8000"],
        ["--worker-args", "--host=0.0.0.0"],
        ["--worker-args", "--otlp-endpoint=http://127.0.0.1:1/v1/traces"],
        ["--worker-args", "--no-tr"],
        ["--worker-args", "--gpu-uuid=GPU-x"],
    ):
        with pytest.raises(SystemExit):
            flags.parse(TuneOptions, argv, {})


@pytest.mark.parametrize(
    ("sweep", "message"),
    [
        ("max-batch-size", "--sweep: expected WORKER-FLAG=V1,V2,..."),
        ("warp-speed=1,2", "--sweep: the worker has no flag --warp-speed (see 'gpuscope worker"),
        ("port=1,2", "--sweep: --port is set by the tuner, not swept"),
    ],
)
def test_a_bad_sweep_says_what_is_wrong_with_it(
    sweep: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from gpuscope.loadgen.tune import TuneOptions

    with pytest.raises(SystemExit):
        flags.parse(TuneOptions, ["--sweep", sweep], {})
    assert capsys.readouterr().err.startswith(f"gpuscope tune: {message}")


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGHUP])
def test_the_demo_stopped_by_a_supervisor_stops_what_it_started(
    stop_signal: signal.Signals,
) -> None:
    # kill, timeout, make and systemd send SIGTERM; a closed terminal SIGHUP. The
    # exporter and worker run in sessions of their own, so nothing else stops them.
    before = gpuscope_processes()
    argv = ["demo", "--duration-s", "1", "--concurrency", "2"]
    argv += ["--exporter-port", "0", "--worker-port", "0"]
    process = subprocess.Popen(
        [*GPUSCOPE, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout is not None
        for line in process.stdout:  # ends early, at EOF, if the demo fails
            if line.startswith("serving on"):
                break
        assert len(gpuscope_processes() - before) == 3  # the demo, its exporter and worker
        process.send_signal(stop_signal)
        _, err = process.communicate(timeout=60)
    finally:
        process.kill()
        left = gpuscope_processes() - before
        for pid in left:  # so that a failure here leaves no process to the other tests
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert process.returncode == 0, err
    assert left == set()


def test_a_killed_demo_takes_its_exporter_and_worker_with_it() -> None:
    # SIGKILL runs no handler of the demo's: the children must learn from the kernel.
    from gpuscope.children import free_port, port_taken

    before = gpuscope_processes()
    ports = free_port(), free_port()
    argv = ["demo", "--duration-s", "1", "--concurrency", "2"]
    argv += ["--exporter-port", str(ports[0]), "--worker-port", str(ports[1])]
    process = subprocess.Popen(
        [*GPUSCOPE, *argv], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    try:
        assert process.stdout is not None
        for line in process.stdout:  # both children ready
            if line.startswith("exporter: "):
                break
        assert all(port_taken(port) for port in ports)
        process.kill()
        process.wait(30)
        wait_for(lambda: not any(port_taken(port) for port in ports), "both ports closed")
        wait_for(lambda: not gpuscope_processes() - before, "both children gone")
    finally:
        process.kill()
        for pid in gpuscope_processes() - before:  # leave nothing to the other tests
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        process.communicate(timeout=30)  # the children held its standard output
