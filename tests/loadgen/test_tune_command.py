"""``gpuscope tune --command``: any server started per value, traced, loaded and stopped;
one that does not start is a row that says why. Real processes throughout: the tuner
as a command, and ``tests/support/command_server.py`` (the standard library's HTTP
server) as the engine."""

from __future__ import annotations

import csv
import io
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gpuscope.flags import ConfigError
from gpuscope.loadgen import record
from gpuscope.loadgen.server_command import log_tail, render
from gpuscope.loadgen.tune import TuneOptions
from support.gpuscope_processes import GPUSCOPE, gpuscope_processes
from support.waiting import wait_until

# starts child processes: not part of the fast tier (tests/support/fast_tier.py)
pytestmark = pytest.mark.processes

REPO = Path(__file__).resolve().parents[2]
SERVER = REPO / "tests" / "support" / "command_server.py"
SERVE = f"{shlex.quote(sys.executable)} {shlex.quote(str(SERVER))} --port {{port}}"
# a short ladder: the development machine has two cores shared with others
LADDER = ["--mix", "embeddings=1", "--concurrency", "2", "--duration-s", "1.5", "--warmup-s", "0.2"]
QUIET_OBJECTIVE = ["--objective", "max throughput with p99 <= 5000 ms"]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is dead but still listed until its parent reaps it
    stat = Path(f"/proc/{pid}/stat").read_text() if Path(f"/proc/{pid}").exists() else ""
    return bool(stat) and stat.rsplit(")", 1)[1].split()[0] != "Z"


def tune(
    tmp_path: Path, command: str, sweep: str, *extra: str, timeout_s: float = 120
) -> subprocess.CompletedProcess[str]:
    args = [
        *GPUSCOPE, "tune", "--command", command, "--sweep", sweep,
        "--work-dir", str(tmp_path / "work"), "--record", str(tmp_path / "record.md"),
        "--server-metrics-format", "none", *LADDER, *QUIET_OBJECTIVE, *extra,
    ]  # fmt: skip
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout_s, check=False)


def rows(tmp_path: Path) -> list[dict[str, str]]:
    return record.read_record((tmp_path / "record.md").read_text())


def test_each_value_gets_its_own_server_traced_to_the_exporter_and_stopped(
    tmp_path: Path,
) -> None:
    command = f"{SERVE} --delay-ms {{value}} --state {{workdir}}/state.json --otlp {{otlp}}"
    done = tune(tmp_path, command, "delay-ms=2,40")
    assert done.returncode == 0, done.stderr
    got = rows(tmp_path)
    assert [(r["config"], r["load"]) for r in got] == [
        ("delay-ms=2", "c=2"),
        ("delay-ms=40", "c=2"),
    ]
    assert all(int(r["ok"]) > 0 and r["errors"] == "0" for r in got)
    # each value's server ran with that value: its delay shows in the client's P50
    fast, slow = (float(r["p50 ms"]) for r in got)
    assert fast < 20 < 40 <= slow
    states = [json.loads(p.read_text()) for p in sorted((tmp_path / "work").glob("*/state.json"))]
    assert [s["delay_ms"] for s in states] == [2.0, 40.0]
    for state in states:
        env = state["env"]
        assert env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] == state["otlp_flag"]
        assert state["otlp_flag"].startswith("http://127.0.0.1:")
        assert state["otlp_flag"].endswith("/v1/traces")
        assert env["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] == "http/protobuf"
        assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] + "/v1/traces" == state["otlp_flag"]
        # the exporter polls the machine's own GPU (none here), not a simulated one
        assert "GPUSCOPE_GPU_UUID" not in env
        assert not alive(state["pid"]), "a server outlived its value"
    assert "best under" in done.stdout and "delay-ms=2" in done.stdout.split("best under")[1]
    # the command that ran is kept beside its log
    assert "--delay-ms 40" in (tmp_path / "work" / "02-40" / "command").read_text()


# The reference worker as any engine: its compute spans name the simulated GPU that
# --simulated-gpu gives the command in GPUSCOPE_GPU_UUID, so the GPU works with the load.
WORKER_COMMAND = (
    "sh -c 'exec " + shlex.join([sys.executable, "-m", "gpuscope", "worker"])
    + ' --host 127.0.0.1 --port {port} --otlp-endpoint {otlp} --gpu-uuid "$GPUSCOPE_GPU_UUID"'
    " --max-batch-size {value} --hidden-size 64 --layers 1 --log-level warning'"
)  # fmt: skip


def test_a_simulated_gpu_fills_the_gpu_columns_of_command_rows(tmp_path: Path) -> None:
    done = tune(
        tmp_path, WORKER_COMMAND, "max-batch-size=1,4", "--simulated-gpu",
        "--server-metrics-format", "exporter", "--ready-path", "/readyz",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    got = rows(tmp_path)
    assert [r["config"] for r in got] == ["max-batch-size=1", "max-batch-size=4"]
    for row in got:
        assert int(row["ok"]) > 0 and row["errors"] == "0"
        # the worker's spans reached the exporter: phases and batch
        assert row["compute ms"] and 1 <= float(row["batch"]) <= 4
        # the simulated GPU (an H100-like part), busy with the worker's compute spans:
        # SM occupancy and SM clock over its maximum are fractions, PCIe moves bytes
        occupancy, clock, pcie = (float(row[c]) for c in ("sm occ", "clock", "pcie MB/s"))
        assert 0 <= occupancy <= 1
        assert 0.1 < clock <= 1  # idle is 345 MHz of 1980 (0.17), under load up to 1
        assert 0 < pcie < 64_000 * 2  # PCIe gen5 x16: 63 GB/s a direction
    assert float(got[0]["batch"]) == 1.0
    # an idle simulated GPU has no SM occupancy: the load's spans reached it
    assert max(float(r["sm occ"]) for r in got) > 0


def test_a_sweep_of_models_is_a_sweep_of_a_command_value_with_rows_named_model(
    tmp_path: Path,
) -> None:
    # two "quantisations" of one model, each its own server; a '/' in a value is no folder
    command = f"{SERVE} --model {{value}} --delay-ms 2 --state {{workdir}}/state.json"
    models = ["org/tiny-awq", "org/tiny-gptq"]
    done = tune(tmp_path, command, ",".join(models), "--sweep-name", "model")
    assert done.returncode == 0, done.stderr
    got = rows(tmp_path)
    assert [r["config"] for r in got] == ["model=org/tiny-awq", "model=org/tiny-gptq"]
    # each server served only its own model (another is a 404): the load asked each
    # for the model it listed
    assert all(int(r["ok"]) > 0 and r["errors"] == "0" for r in got)
    folders = sorted(p.name for p in (tmp_path / "work").iterdir())
    assert folders == ["01-org_tiny-awq", "02-org_tiny-gptq"]
    states = [json.loads((tmp_path / "work" / f / "state.json").read_text()) for f in folders]
    assert [s["model"] for s in states] == models
    assert [s["env"]["GPUSCOPE_TUNE_CONFIG"] for s in states] == [r["config"] for r in got]
    # the verdict names the models as the rows do
    best = done.stdout.split("best under ")[1].splitlines()
    assert best[0].split(": ")[1] in {"model=org/tiny-awq", "model=org/tiny-gptq"}
    assert best[1].startswith("  model=org/tiny-")
    assert sorted(r["verdict"] for r in got) == ["best", "lost"]


def test_a_command_that_exits_at_start_is_a_row_with_its_reason_and_the_sweep_goes_on(
    tmp_path: Path,
) -> None:
    # a value that selects the failing behaviour: the second value still runs
    done = tune(tmp_path, f"{SERVE} --behave {{value}}", "behave=exit,normal")
    assert done.returncode == 0, done.stderr
    failed, ran = rows(tmp_path)
    assert failed["config"] == "behave=exit" and failed["load"] == "not started"
    assert "exited with status 3 while starting" in failed["errors"]
    assert "error: no such model 'missing'" in failed["errors"]  # its log's last line
    assert ran["config"] == "behave=normal" and int(ran["ok"]) > 0
    assert "behave=exit: did not start: exited with status 3" in done.stdout
    # the table's note carries the log's last lines
    assert "its log ends: loading the model / error: no such model 'missing'" in done.stdout


def test_a_program_that_does_not_exist_is_a_row(tmp_path: Path) -> None:
    done = tune(tmp_path, "/nonexistent/engine --port {port} --n {value}", "1,2")
    assert done.returncode == 1  # no value met the objective: none ran
    assert [r["errors"] for r in rows(tmp_path)] == [
        "cannot run '/nonexistent/engine': No such file or directory"
    ] * 2


def test_a_server_that_cannot_be_loaded_or_dies_under_load_is_said_so(tmp_path: Path) -> None:
    done = tune(tmp_path, f"{SERVE} --behave {{value}}", "no-models,dies")
    unloaded, died = rows(tmp_path)
    assert unloaded["load"] == "not started"
    assert unloaded["errors"].startswith("started but could not be loaded: ")
    assert "/models answered 404; pass --model" in unloaded["errors"]
    assert died["load"] == "c=2" and "connection" in died["errors"]
    assert "value=dies c=2: the server exited with status 5 during the load: " in done.stdout
    assert "fatal: the engine died" in done.stdout


def test_a_server_never_ready_is_stopped_at_the_start_timeout(tmp_path: Path) -> None:
    command = f"{SERVE} --behave {{value}} --state {{workdir}}/state.json"
    started = time.monotonic()
    done = tune(tmp_path, command, "never-ready,normal", "--start-timeout-s", "2")
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - started < 60
    failed = rows(tmp_path)[0]
    assert failed["load"] == "not started"
    assert failed["errors"].startswith("not ready at http://127.0.0.1:")
    assert "/health after 2 s" in failed["errors"]
    state = json.loads((tmp_path / "work" / "01-never-ready" / "state.json").read_text())
    assert not alive(state["pid"])


def test_a_server_that_ignores_sigterm_gets_sigkill_after_the_grace(tmp_path: Path) -> None:
    command = f"{SERVE} --behave {{value}} --state {{workdir}}/state.json"
    done = tune(tmp_path, command, "ignore-sigterm,normal", "--stop-grace-s", "1")
    assert done.returncode == 0, done.stderr
    assert "server value=ignore-sigterm did not stop within 1 s, killing it" in done.stderr
    state = json.loads((tmp_path / "work" / "01-ignore-sigterm" / "state.json").read_text())
    assert not alive(state["pid"])


def test_ctrl_c_during_the_ladder_leaves_no_server_no_grandchild_and_no_exporter(
    tmp_path: Path,
) -> None:
    before = gpuscope_processes()
    state = tmp_path / "state.json"
    args = [
        *GPUSCOPE, "tune", "--command", f"{SERVE} --behave grandchild --state {state} "
        "--delay-ms {value}", "--sweep", "5,10", "--server-metrics-format", "none",
        "--work-dir", str(tmp_path / "work"), "--concurrency", "2", "--duration-s", "30",
    ]  # fmt: skip
    tuner = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not state.exists():  # the server writes it once started
            assert time.monotonic() < deadline, "the server never started"
            time.sleep(0.2)  # another process's progress gives no event to wait on
        time.sleep(2.0)  # timed: past the tuner's second of warm-up, into the ladder
        pids = json.loads(state.read_text())
        started = gpuscope_processes() - before
        assert tuner.pid in started and len(started) >= 2  # the tuner and its exporter
        tuner.send_signal(signal.SIGINT)
        _, stderr = tuner.communicate(timeout=60)
    finally:
        if tuner.poll() is None:
            tuner.kill()
    assert tuner.returncode == 130, stderr
    assert not alive(pids["pid"]) and not alive(pids["grandchild"])
    assert gpuscope_processes() - before == set(), "the tuner's exporter outlived it"
    assert not (tmp_path / "work" / "02-10").exists(), "the sweep went on after Ctrl-C"


def test_sigterm_while_a_server_starts_stops_it_and_the_sweep(tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    args = [
        *GPUSCOPE, "tune", "--command", f"{SERVE} --behave never-ready --state {state} "
        "--delay-ms {value}", "--sweep", "5,10", "--server-metrics-format", "none",
        "--work-dir", str(tmp_path / "work"), "--start-timeout-s", "120",
    ]  # fmt: skip
    tuner = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not state.exists():
            assert time.monotonic() < deadline, "the server never started"
            time.sleep(0.2)  # another process's progress gives no event to wait on
        pid = json.loads(state.read_text())["pid"]
        tuner.send_signal(signal.SIGTERM)
        _, stderr = tuner.communicate(timeout=60)
    finally:
        if tuner.poll() is None:
            tuner.kill()
    assert tuner.returncode == 130, stderr
    assert not alive(pid)
    assert not (tmp_path / "work" / "02-10").exists()


def test_a_config_template_is_rendered_per_value_and_named_by_the_command(
    tmp_path: Path,
) -> None:
    template = tmp_path / "server.json"
    # braces that are not placeholders stay as they are
    template.write_text('{"delay_ms": {value}, "port": {port}, "note": "{not a placeholder}"}\n')
    command = f"{shlex.quote(sys.executable)} {shlex.quote(str(SERVER))} --config {{config}}"
    done = tune(
        tmp_path, command, "1,30", "--config-template", str(template),
        "--config-name", "conf/server.json", "--sweep-name", "delay-ms",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    rendered = [json.loads(p.read_text()) for p in sorted((tmp_path / "work").glob("*/conf/*"))]
    assert [r["delay_ms"] for r in rendered] == [1, 30]
    assert rendered[0]["note"] == "{not a placeholder}"
    assert rendered[0]["port"] != rendered[1]["port"]
    assert [r["config"] for r in rows(tmp_path)] == ["delay-ms=1", "delay-ms=30"]
    assert float(rows(tmp_path)[1]["p50 ms"]) >= 30


def utc_second() -> str:
    """Now as the record's run column writes it."""
    return datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S")


def test_the_record_grows_across_runs_each_row_with_its_run_and_verdict(tmp_path: Path) -> None:
    outputs = []
    # the first run plots its own steps, the second the whole record (both runs)
    plots = [["--plot", str(tmp_path / "run.png")],
             ["--plot", str(tmp_path / "record.png"), "--plot-record"]]  # fmt: skip
    for plot in plots:
        done = tune(tmp_path, f"{SERVE} --delay-ms {{value}}", "1,40", "--csv", "-", *plot)
        assert done.returncode == 0, done.stderr
        outputs.append((done.stdout, done.stderr))  # with the CSV on stdout, the table is on stderr
        # the run column is to the second (UTC): the next run starts in a later one (a
        # run takes seconds, so this is at once where a fixed second's sleep was)
        stamp = rows(tmp_path)[-1]["run"]

        def later(stamp: str = stamp) -> bool:
            return utc_second() != stamp

        wait_until(later, "a second after the run's")
    text = (tmp_path / "record.md").read_text()
    got = rows(tmp_path)
    assert len(got) == 4 and text.count("| when |") == 1
    runs = [r["run"] for r in got]
    assert runs[0] == runs[1] != runs[2] == runs[3]
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", runs[0])
    for row in got:  # filled after the sweep, in the rows appended value by value
        if row["config"] == "value=1":
            assert row["verdict"] == "best"
            assert row["why"].startswith("under 'max throughput with p99 <= 5000 ms': ")
            # the why rounds the step's p99 to 0.1 ms, the column to 0.01 ms: rounding the
            # column again can differ (5.25 from 5.2537 reads 5.2, the why says 5.3)
            why_p99 = re.search(r"req/s at c=2 \(p99 ([0-9.]+) ms\)", row["why"])
            assert why_p99, row["why"]
            assert abs(float(why_p99.group(1)) - float(row["p99 ms"])) <= 0.051, row
        else:
            assert row["verdict"] == "lost"
            # the loser's line of the printed verdict, without its name
            assert row["why"].startswith(row["req/s"] + " req/s at c=2")
            assert "; at c=2 p99 " in row["why"]
    for (out, err), own in zip(outputs, (got[:2], got[2:]), strict=True):
        loser = next(line for line in err.splitlines() if line.startswith("  value=40: "))
        assert own[1]["why"] == loser.removeprefix("  value=40: ")
        # the CSV carries the same columns
        csv_rows = list(csv.DictReader(io.StringIO(out)))
        assert [(r["verdict"], r["run"]) for r in csv_rows] == [
            ("best", own[0]["run"]), ("lost", own[1]["run"])
        ]  # fmt: skip
    for png in ("run.png", "record.png"):  # matplotlib is in the dev extra: no skip here
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ---------------------------------------------------------------------------------------
# Without processes: the checks of the flags and the rendering.


def options(**settings: object) -> TuneOptions:
    return TuneOptions(**settings)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"command": "engine --port {port}", "sweep": "1,2"}, "has no {value}"),
        ({"command": "engine --n {value}", "sweep": "1,2"}, "has no {port}"),
        ({"command": "engine --port {port} --n {value}"}, "give the values to compare"),
        ({"command": "engine {port} {value}", "sweep": "1,1"}, "a value is given twice"),
        ({"command": "engine {port} {value}", "sweep": "1"}, "at least two values"),
        (
            {"command": "engine {port} {value}", "sweep": "1,2", "worker_args": "--layers 1"},
            "is for the reference worker",
        ),
        (
            {"command": "engine {port} {value}", "sweep": "1,2", "config_name": "a.pbtxt"},
            "needs --config-template",
        ),
        ({"command": "engine 'unclosed {port} {value}", "sweep": "1,2"}, "cannot split"),
        ({"command": "engine {port} {value}", "sweep": "1,2", "sweep_name": "a b"}, "a name"),
        ({"engine_metrics": "http://127.0.0.1:9"}, "is for --command's engine"),
        ({"simulated_gpu": True}, "--simulated-gpu: is for --command"),
        (
            {
                "command": "e {port} {value}",
                "sweep": "1,2",
                "simulated_gpu": True,
                "exporter_url": "http://127.0.0.1:9",
            },
            "the tuner starts none",
        ),
        ({"plot_record": True, "record": Path("r.md")}, "--plot-record: needs --plot and"),
        (
            {"command": "e {port} {value}", "sweep": "1,2", "engine_metrics_format": "exporter"},
            "--engine-metrics-format",
        ),
    ],
)
def test_command_flags_are_checked(settings: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        options(**settings)


def test_a_config_template_must_be_named_by_the_command(tmp_path: Path) -> None:
    template = tmp_path / "config.pbtxt"
    template.write_text("dynamic_batching { max_queue_delay_microseconds: {value} }\n")
    with pytest.raises(ConfigError, match=re.escape("with {config} or {workdir}")):
        options(command="tritonserver --http-port {port}", sweep="1,2", config_template=template)
    ok = options(command="s --port {port} --c {config}", sweep="1,2", config_template=template)
    assert ok.values() == ["1", "2"]


def test_sweep_names_and_labels() -> None:
    base = {"command": "engine --port {port} --m {value}"}
    assert options(**base, sweep="model=a,b").label("a") == "model=a"
    assert options(**base, sweep="a,b").label("a") == "value=a"
    assert options(**base, sweep="a,b", sweep_name="quant").label("b") == "quant=b"
    # a value with '=' in it is not a name
    assert options(**base, sweep="k=1,k=2").values() == ["k=1", "k=2"]
    # the reference worker keeps its FLAG=V1,V2 sweep
    assert options(sweep="max-batch-size=4,8").label("8") == "max-batch-size=8"


def test_render_replaces_only_known_placeholders() -> None:
    text = "dynamic_batching { max_queue_delay_microseconds: {value} } port {port} {other}"
    assert render(text, {"value": "100", "port": "9"}) == (
        "dynamic_batching { max_queue_delay_microseconds: 100 } port 9 {other}"
    )


def test_log_tail_keeps_the_last_lines(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_bytes(b"x" * 200_000 + b"\n" + b"".join(b"line %d\n\n" % i for i in range(9)))
    assert log_tail(log, 3) == ["line 6", "line 7", "line 8"]
    assert log_tail(tmp_path / "absent.log") == []
