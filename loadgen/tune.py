"""``gpuscope tune``: one knob swept, the same ladder run at each value, the best named.

The server is the reference worker by default: for each value of ``--sweep
FLAG=V1,V2,...`` it is started on a free loopback port with that worker flag. With
``--command TEMPLATE`` it is any engine: for each value of ``--sweep V1,V2,...`` the
template is rendered (``{value}``, ``{port}``, ``{config}``, ``{otlp}``...: see
``loadgen.server_command``), started in its own process group with the tracing
environment pointing at the exporter, waited on at ``--ready-path`` for at most
``--start-timeout-s``, loaded, and stopped (SIGTERM to the group, SIGKILL after
``--stop-grace-s``). One that exits or never gets ready is a row that says why and
ends with its log's last lines; the sweep goes on. ``--config-template`` renders a
file per value (Triton's ``config.pbtxt``, a Ray Serve YAML) under the value's folder.

Unless ``--exporter-url`` names one, a gpuscope exporter is started once for the whole
sweep: with a simulated GPU for the reference worker, with the machine's own (NVML, or
none) for ``--command`` unless ``--simulated-gpu`` asks for the simulated one there
too. Each value's rows are appended to the record as it ends; at the end, the table and
the best value under ``--objective`` with why the others lose, which then fills the
verdict and why of those rows.
Every process started here is stopped on success, error, Ctrl-C, SIGTERM and SIGHUP.
"""

from __future__ import annotations

import asyncio
import os
import re
import shlex
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from gpuscope import flags
from gpuscope.children import (
    SIMULATED_GPU_INTERVAL_S,
    TRACES_PATH,
    ChildFailed,
    Children,
    free_port,
    run_until_stopped,
    simulated_gpu_uuid,
    wait_ready,
    worker_args,
)
from gpuscope.flags import ConfigError, at_least, http_url, one_of, option, positive
from gpuscope.loadgen import batching_equivalents, record, server_command
from gpuscope.loadgen.engine_metrics import BUILDERS, ENGINE_FORMATS
from gpuscope.loadgen.objective import Objective, ObjectiveError, choose
from gpuscope.loadgen.options import EXPORTER_URL_EXAMPLE, LoadOptions
from gpuscope.loadgen.output import Progress, plot_unavailable, table, table_stream, write_outputs
from gpuscope.loadgen.results import StepResult, not_started
from gpuscope.loadgen.runner import Runner, Target
from gpuscope.loadgen.server_command import Launch, loopback, render

DEFAULT_SWEEP: Final = "max-queue-delay-ms=0.1,0.25,0.5,1,2,5"
# Worker fields the tuner sets itself; a sweep or --worker-args must leave them alone.
OWN_WORKER_FIELDS: Final = ("host", "port", "otlp_endpoint", "gpu_uuid", "no_tracing")
METRICS_FORMATS: Final = (*BUILDERS, "none")
LAST_LINE_CHARS: Final = 200
_SWEEP_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.-]*")


@dataclass(frozen=True)
class TuneOptions(
    LoadOptions,
    prog="gpuscope tune",
    description="Sweep one knob of a server: start it at each value on a free loopback "
    "port, run the same load ladder, and name the best value under an objective, with "
    "where each value's time went. The server is the reference worker (--sweep "
    "WORKER-FLAG=V1,V2,...) or, with --command, any engine: --command 'python -m "
    "vllm.entrypoints.openai.api_server --model M --port {port} --max-num-seqs {value} "
    "--otlp-traces-endpoint {otlp}' --sweep 2,8. Placeholders in --command, --ready-path, "
    "--server-metrics and the --config-template file: {value}, {port}, {metrics_port}, "
    "{grpc_port} (free loopback ports), {config} (the rendered file), {workdir} (the "
    "value's folder), {otlp} (the exporter's OTLP/HTTP traces URL), {exporter}. The "
    "command also gets OTEL_EXPORTER_OTLP_* (http/protobuf) pointing at the exporter.",
    env_prefix="GPUSCOPE_TUNE_",
):
    sweep: str = option(
        DEFAULT_SWEEP,
        help="the values to compare: for the worker FLAG=V1,V2,... (max-queue-delay-ms=0.1,"
        "0.5,1, max-batch-size=4,8,16, batching=none,dynamic,continuous); with --command "
        "V1,V2,... or NAME=V1,V2,... (a model path, a quantisation, a flag's value)",
        metavar="[NAME=]V1,V2,...",
    )
    command: str = option(
        "",
        help="the server's command line, with {value} and {port} (default: the reference "
        "worker); split as a shell would, run without one",
        metavar="TEMPLATE",
    )
    sweep_name: str = option(
        "",
        help="what the rows call the swept knob with --command, e.g. max-num-seqs or model "
        "(default: NAME of --sweep, else 'value')",
        metavar="NAME",
    )
    config_template: Path | None = option(
        None,
        help="with --command: a file rendered per value (placeholders as above) to "
        "<work-dir>/<value>/<--config-name>; the command names it with {config} or "
        "{workdir}",
    )
    config_name: str = option(
        "",
        help="the rendered file's path under the value's folder, e.g. "
        "models/m/config.pbtxt for a Triton model repository (default: the template's name)",
        metavar="RELATIVE-PATH",
    )
    work_dir: Path | None = option(
        None,
        help="with --command: where each value's folder (its log, its rendered file) goes "
        "(default: a new temporary folder, printed)",
    )
    ready_path: str = option(
        "/health",
        help="with --command: the path on {port} that answers 200 once the server serves "
        "(Triton: /v2/health/ready or /v2/models/M/ready; the worker: /readyz)",
        metavar="PATH",
    )
    start_timeout_s: float = option(
        180.0, help="with --command: how long a server may take to get ready", check=positive
    )
    stop_grace_s: float = option(
        10.0,
        help="with --command: how long a server has to exit after SIGTERM before its "
        "process group gets SIGKILL",
        check=at_least(0),
    )
    api_path: str = option(
        "/v1",
        help="with --command: the API's root on {port} (/v1 for OpenAI-compatible servers; "
        "'' for Triton's KServe v2 'infer' requests of --requests-file)",
        metavar="PATH",
    )
    server_metrics: str = option(
        "",
        help="with --command: whose /metrics give the server-side view, a base URL "
        "template such as http://127.0.0.1:{metrics_port} (default: the exporter's)",
        metavar="URL",
    )
    server_metrics_format: str = option(
        "exporter",
        help="what --server-metrics serves: exporter (gpuscope's, from the engine's spans), "
        "triton (Triton's nv_inference_* counters), vllm (vLLM's own request histograms, "
        "no spans needed) or none (client side only)",
        check=one_of(METRICS_FORMATS),
    )
    engine_metrics: str = option(
        "",
        help="with --command: the engine's own /metrics, a base URL template such as "
        "http://127.0.0.1:{port} (vLLM's), read around the same requests as the server-side "
        "view: each row then shows the engine's phase means beside the tuner's, and the two "
        "scrapes bounding each step are kept in the value's folder (engine-metrics/)",
        metavar="URL",
    )
    engine_metrics_format: str = option(
        "vllm",
        help="what --engine-metrics serves: vllm (its request_queue_time and "
        "request_inference_time histograms) or triton (its nv_inference_* counters)",
        check=one_of(ENGINE_FORMATS),
    )
    objective: str = option(
        "max throughput with p99 <= 100 ms",
        help="'max throughput with p99 <= X ms' or 'min p99 at rate R' (R one of --rate)",
        metavar="OBJECTIVE",
    )
    exporter_url: str | None = option(
        None,
        help="an exporter the worker should send spans to (default: start one)",
        check=http_url(EXPORTER_URL_EXAMPLE),
    )
    simulated_gpu: bool = option(
        False,
        help="with --command: the exporter the tuner starts simulates a GPU, as for the "
        "reference worker, instead of polling the machine's own; the command gets its UUID "
        "in GPUSCOPE_GPU_UUID (gpuscope's middleware reads it; pass it to the reference "
        "worker as --gpu-uuid). To try a sweep where there is no GPU: the GPU columns then "
        "describe the simulation, driven by the engine's compute spans, not the engine",
    )
    worker_args: str = option(
        "", help="further worker flags for every run, e.g. '--hidden-size 128'", metavar="FLAGS"
    )

    def check(self) -> None:
        super().check()
        if self.command:
            self._check_command()
        elif self.engine_metrics:
            raise ConfigError(f"{_flag('engine_metrics')}: is for --command's engine")
        elif self.simulated_gpu:
            raise ConfigError(
                f"{_flag('simulated_gpu')}: is for --command (the reference worker's sweeps "
                "always simulate one)"
            )
        if self.simulated_gpu and self.exporter_url is not None:
            raise ConfigError(
                f"{_flag('simulated_gpu')}: the exporter of {_flag('exporter_url')} polls "
                "what it was started with; the tuner starts none"
            )
        try:
            objective = Objective.parse(self.objective)
        except ObjectiveError as exc:
            raise ConfigError(str(exc)) from None
        if objective.kind == "min-p99" and objective.bound not in [x.value for x in self.loads()]:
            raise ConfigError(
                f"{_flag('objective')}: '{objective}' needs that rate in {_flag('rate')}"
            )
        for value in self.values():
            if not self.command:
                self.worker_argv(value, port=0, otlp=f"http://127.0.0.1:1{TRACES_PATH}")

    def _check_command(self) -> None:
        if self.sweep == DEFAULT_SWEEP:
            raise ConfigError(
                f"{_flag('command')}: give the values to compare with {_flag('sweep')} "
                "(e.g. --sweep 2,8 or --sweep max-num-seqs=2,8)"
            )
        if self.worker_args:
            raise ConfigError(f"{_flag('worker_args')}: is for the reference worker, not --command")
        try:
            words = shlex.split(self.command)
        except ValueError as exc:
            raise ConfigError(
                f"{_flag('command')}: cannot split it as a shell would: {exc}"
            ) from None
        if not words:
            raise ConfigError(f"{_flag('command')}: is empty")
        template = ""
        if self.config_template is not None:
            try:
                template = self.config_template.read_text()
            except (OSError, UnicodeDecodeError) as exc:
                raise ConfigError(f"{_flag('config_template')}: cannot read it: {exc}") from None
            if not {"config", "workdir"} & server_command.placeholders(self.command):
                raise ConfigError(
                    f"{_flag('command')}: name the rendered {_flag('config_template')} with "
                    "{config} or {workdir}"
                )
        elif self.config_name:
            raise ConfigError(f"{_flag('config_name')}: needs {_flag('config_template')}")
        if self.config_name and (
            Path(self.config_name).is_absolute() or ".." in Path(self.config_name).parts
        ):
            raise ConfigError(f"{_flag('config_name')}: a path inside the value's folder")
        for name in ("value", "port"):
            if name not in server_command.placeholders(self.command + template):
                raise ConfigError(
                    f"{_flag('command')}: has no {{{name}}} (nor has {_flag('config_template')})"
                    + ("; every value would start the same server" if name == "value" else
                       "; the server must listen on the port gpuscope gives it")
                )  # fmt: skip
        if self.sweep_name and not _SWEEP_NAME.fullmatch(self.sweep_name):
            raise ConfigError(f"{_flag('sweep_name')}: a name such as max-num-seqs or model")

    @property
    def knob(self) -> str:
        """What the rows call the swept knob."""
        if not self.command:
            return self.flag
        return self.sweep_name or self._split_sweep()[0] or "value"

    def _split_sweep(self) -> tuple[str, str]:
        """--command's sweep as (NAME or '', the values): ``NAME=`` is a name only when
        no value holds an '=' of its own (``k=1,k=2`` is two values)."""
        name, sep, rest = self.sweep.partition("=")
        if sep and _SWEEP_NAME.fullmatch(name.strip()) and "=" not in rest:
            return name.strip(), rest
        return "", self.sweep

    def _command_values(self) -> list[str]:
        return [v.strip() for v in self._split_sweep()[1].split(",") if v.strip()]

    def launch(
        self,
        index: int,
        value: str,
        work_dir: Path,
        exporter_url: str,
        gpu_uuid: str | None,
    ) -> Launch:
        """One value's engine: ports picked, the config file rendered, the command built."""
        label = self.label(value)
        workdir = work_dir / f"{index + 1:02d}-{server_command.safe_name(value)}"
        workdir.mkdir(parents=True, exist_ok=True)
        port = free_port()
        values = {
            "value": value,
            "port": str(port),
            "metrics_port": str(free_port()),
            "grpc_port": str(free_port()),
            "workdir": str(workdir),
            "otlp": exporter_url.rstrip("/") + TRACES_PATH,
            "exporter": exporter_url.rstrip("/"),
        }
        config = None
        if self.config_template is not None:
            config = workdir / (self.config_name or self.config_template.name)
            values["config"] = str(config)
            server_command.render_config(self.config_template, config, values)
        argv = [render(word, values) for word in shlex.split(self.command)]
        env = {
            **os.environ,
            **server_command.tracing_environment(exporter_url, gpu_uuid, label),
        }
        metrics = render(self.server_metrics, values) if self.server_metrics else exporter_url
        engine = render(self.engine_metrics, values) if self.engine_metrics else None
        return Launch(
            label=label,
            argv=argv,
            env=env,
            workdir=workdir,
            log=workdir / "server.log",
            config=config,
            port=port,
            ready_url=loopback(port, render(self.ready_path, values)),
            base_url=loopback(port, render(self.api_path, values).rstrip("/")),
            metrics_url=metrics,
            engine_metrics_url=engine,
        )

    @property
    def flag(self) -> str:
        """The swept worker flag, as the sweep names it (without its dashes)."""
        from gpuscope.worker.config import WorkerConfig

        name, sep, _ = self.sweep.partition("=")
        name = name.strip()
        if not sep:
            raise ConfigError(
                f"{_flag('sweep')}: expected WORKER-FLAG=V1,V2,... such as {DEFAULT_SWEEP}, "
                f"got {self.sweep!r}"
            )
        field = flags.field_of(WorkerConfig, f"--{name}")
        if field in OWN_WORKER_FIELDS:
            raise ConfigError(f"{_flag('sweep')}: --{name} is set by the tuner, not swept")
        if field is None:
            raise ConfigError(
                f"{_flag('sweep')}: the worker has no flag --{name} (see 'gpuscope worker --help')"
            )
        return name

    def values(self) -> list[str]:
        if self.command:
            values = self._command_values()
        else:
            self.flag  # noqa: B018 - validates the name first
            values = [v.strip() for v in self.sweep.partition("=")[2].split(",") if v.strip()]
        if len(values) < 2:
            raise ConfigError(
                f"{_flag('sweep')}: give at least two values to compare, got {self.sweep!r}"
            )
        if len(set(values)) < len(values):
            raise ConfigError(f"{_flag('sweep')}: a value is given twice in {self.sweep!r}")
        return values

    def label(self, value: str) -> str:
        return f"{self.knob}={value}"

    def worker_argv(
        self, value: str, port: int, otlp: str, gpu_uuid: str | None = None
    ) -> list[str]:
        """The worker's command line for one value, checked by the worker's own parser.

        The tuner's settings come first, so that ``--worker-args`` can change the log
        level; the swept value and the GPU come last, so that they win."""
        from gpuscope.worker.config import WorkerConfig

        own = {"host": "127.0.0.1", "port": port, "otlp_endpoint": otlp, "gpu_uuid": gpu_uuid}
        args = worker_args(port, otlp_endpoint=otlp, log_level="warning")
        args += [*shlex.split(self.worker_args), f"--{self.flag}", value]
        if gpu_uuid is not None:
            args += flags.to_argv(WorkerConfig, gpu_uuid=gpu_uuid)
        try:
            config = flags.parse(WorkerConfig, args[1:], {}, exit_on_error=False)
        except ConfigError as exc:
            raise ConfigError(f"{_flag('sweep')} / {_flag('worker_args')}: {exc}") from None
        # Checked on the parsed flags, not the words: argparse also takes --port=N and
        # abbreviations such as --po N, which would move the worker where nobody waits.
        for field in OWN_WORKER_FIELDS:
            if getattr(config, field) != own.get(field, False):
                flag = flags.spelling(WorkerConfig, field)
                raise ConfigError(f"{_flag('worker_args')}: {flag} is set by the tuner")
        return args


def _flag(field: str) -> str:
    return flags.spelling(TuneOptions, field)


async def run_sweep(
    options: TuneOptions, stop: asyncio.Event, progress: Progress, env: str, run: str = ""
) -> dict[str, list[StepResult]]:
    """Each value's steps, in sweep order; stops early (keeping what ran) when ``stop`` is set."""
    sweep: dict[str, list[StepResult]] = {}
    with Children() as children:
        exporter_url, gpu_uuid = options.exporter_url, None
        if exporter_url is None and options.command and not options.simulated_gpu:
            # another engine runs on the machine's own GPU, if any: the exporter polls
            # that (NVML), not a simulated one whose state would be nobody's
            exporter = children.exporter(
                gpu_interval_s=SIMULATED_GPU_INTERVAL_S, log_level="warning"
            )
            await exporter.wait_ready(stop)
            exporter_url = exporter.url
        elif exporter_url is None:
            exporter = children.simulated_exporter()
            await exporter.wait_ready(stop)
            exporter_url, gpu_uuid = exporter.url, simulated_gpu_uuid(0)
        work_dir = _work_dir(options) if options.command else None
        for index, value in enumerate(options.values()):
            if stop.is_set():
                break
            if work_dir is not None:
                steps = await _run_command(
                    options, children, stop, progress, index, value, work_dir,
                    exporter_url, gpu_uuid,
                )  # fmt: skip
            else:
                steps = await _run_worker(
                    options, children, stop, progress, value, exporter_url, gpu_uuid
                )
            if steps is None:  # stopped while it started
                break
            sweep[options.label(value)] = steps
            if options.record is not None and steps:
                rows = [record.step_row(s, env, run=run) for s in steps]
                record.append_record(options.record, rows)
    return sweep


async def _run_worker(
    options: TuneOptions,
    children: Children,
    stop: asyncio.Event,
    progress: Progress,
    value: str,
    exporter_url: str,
    gpu_uuid: str | None,
) -> list[StepResult] | None:
    port = free_port()
    name = f"worker {options.label(value)}"
    argv = options.worker_argv(value, port, exporter_url + TRACES_PATH, gpu_uuid)
    worker = children.adopt(name, argv, port)
    try:
        await worker.wait_ready(stop)
    except ChildFailed:
        if stop.is_set():
            return None
        raise
    target = Target(f"{worker.url}/v1", exporter_url, options.model)
    steps = await _ladder(options, target, options.label(value), stop, progress)
    children.stop(name)
    return steps


async def _run_command(
    options: TuneOptions,
    children: Children,
    stop: asyncio.Event,
    progress: Progress,
    index: int,
    value: str,
    work_dir: Path,
    exporter_url: str,
    gpu_uuid: str | None,
) -> list[StepResult] | None:
    """One value of --command: started, waited on, loaded and stopped; a server that
    does not start is one row saying why (None: stopped meanwhile)."""
    launch = options.launch(index, value, work_dir, exporter_url, gpu_uuid)
    label, first_load = launch.label, options.loads()[0]
    (launch.workdir / "command").write_text(launch.command_line + "\n")
    print(f"gpuscope tune: {label}: starting {launch.command_line}", file=sys.stderr)
    name = f"server {label}"
    started = time.monotonic()
    try:
        process = children.start_command(
            name, launch.argv, log=launch.log, env=launch.env,
            grace_s=options.stop_grace_s,
        )  # fmt: skip
    except OSError as exc:
        why = f"cannot run {launch.argv[0]!r}: {exc.strerror or exc}"
        print(f"gpuscope tune: {label}: {why}", file=sys.stderr)
        return [not_started(first_load, label, why, [])]
    try:
        await wait_ready(name, launch.ready_url, process, stop, options.start_timeout_s)
    except ChildFailed as exc:
        children.stop(name)
        if stop.is_set():
            return None
        lines = server_command.log_tail(launch.log)
        why = str(exc).removeprefix(f"{name} ")
        if lines:  # one line in the row (a traceback's last can be long), all in the note
            last = lines[-1]
            cut = last if len(last) <= LAST_LINE_CHARS else last[:LAST_LINE_CHARS] + "..."
            why += f"; its log's last line: {cut}"
        print(f"gpuscope tune: {label}: {why}; log {launch.log}", file=sys.stderr)
        return [not_started(first_load, label, why, lines)]
    print(
        f"gpuscope tune: {label}: ready in {time.monotonic() - started:.1f} s (log {launch.log})",
        file=sys.stderr,
    )
    metrics = None if options.server_metrics_format == "none" else launch.metrics_url
    target = Target(
        launch.base_url, metrics, options.model, _metrics_format(options),
        engine_url=launch.engine_metrics_url, engine_format=options.engine_metrics_format,
        engine_dump=launch.workdir / "engine-metrics" if launch.engine_metrics_url else None,
    )  # fmt: skip
    try:
        steps = await _ladder(options, target, label, stop, progress)
    except RuntimeError as exc:  # no load could start (no model listed, say): a row too
        why = f"started but could not be loaded: {exc}"
        print(f"gpuscope tune: {label}: {why}", file=sys.stderr)
        return [not_started(first_load, label, why, server_command.log_tail(launch.log))]
    finally:
        exited = process.poll()  # before the stop: did it die under the load?
        children.stop(name)
    if exited is not None and steps:
        tail = " / ".join(server_command.log_tail(launch.log))
        steps[-1].notes.append(f"the server exited with status {exited} during the load: {tail}")
    return steps


def _metrics_format(options: TuneOptions) -> str:
    fmt = options.server_metrics_format
    return "exporter" if fmt == "none" else fmt


async def _ladder(
    options: TuneOptions, target: Target, label: str, stop: asyncio.Event, progress: Progress
) -> list[StepResult]:
    runner = Runner(
        options.plan(label), target, options.request_stream(), stop,
        tick=progress, on_step=progress.step_done,
    )  # fmt: skip
    return await runner.run()


def _work_dir(options: TuneOptions) -> Path:
    if options.work_dir is not None:
        options.work_dir.mkdir(parents=True, exist_ok=True)
        return options.work_dir
    path = Path(tempfile.mkdtemp(prefix="gpuscope-tune-"))
    print(f"gpuscope tune: each value's log and files under {path}", file=sys.stderr)
    return path


def main(argv: Sequence[str]) -> int:
    options = flags.parse(TuneOptions, argv)
    if plot_unavailable(options, "gpuscope tune"):
        return 2
    progress = Progress()
    env, run = record.environment(), record.run_stamp()
    try:
        sweep, stopped = run_until_stopped(
            lambda stop: run_sweep(options, stop, progress, env, run)
        )
    except (ChildFailed, RuntimeError) as exc:
        print(f"gpuscope tune: {exc}", file=sys.stderr)
        return 1
    steps = [step for config_steps in sweep.values() for step in config_steps]
    verdict = choose(Objective.parse(options.objective), sweep)
    stream = table_stream(options)
    # the best worker value as Triton's and Ray Serve's batching settings
    lines = list(verdict.lines)
    if not options.command:  # another engine's settings are its own, not the worker's
        lines += batching_equivalents.for_tune(options, verdict.best)
    print(table(steps, env) + "\n".join(lines), file=stream, flush=True)
    if options.record is not None:  # its rows grew value by value: now their verdict
        record.settle_verdict(options.record, run, verdict.by_config)
    write_outputs(
        options, steps, env, with_record=False, run=run, verdicts=verdict.by_config,
        view=options.server_metrics_format if options.command else "exporter",
    )  # fmt: skip
    if stopped:
        print(
            "stopped (Ctrl-C, SIGTERM or SIGHUP); every process it started is stopped",
            file=sys.stderr,
        )
        return 130
    return 0 if verdict.best is not None else 1
