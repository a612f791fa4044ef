"""``gpuscope tune``: one worker flag swept, the same ladder run at each value, the best named.

For each value of ``--sweep FLAG=V1,V2,...`` the reference worker is started on a free
loopback port with that value (and, unless ``--exporter-url`` names one, a gpuscope
exporter with a simulated GPU is started once for the whole sweep), the ladder runs,
the worker is stopped and the value's rows are appended to the record. At the end the
table, and the best value under ``--objective`` with why the others lose. Every process
started here is stopped on success, error, Ctrl-C, SIGTERM and SIGHUP.
"""

from __future__ import annotations

import asyncio
import shlex
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Final

from gpuscope import flags
from gpuscope.flags import ConfigError
from gpuscope.loadgen import batching_equivalents, record
from gpuscope.loadgen.cli import plot_unavailable, run_with_ctrl_c, table_stream, write_outputs
from gpuscope.loadgen.objective import Objective, ObjectiveError, choose
from gpuscope.loadgen.options import LOAD_HELP, LoadOptions, check_url
from gpuscope.loadgen.output import Progress, table
from gpuscope.loadgen.processes import ChildFailed, Children, free_port, wait_ready
from gpuscope.loadgen.results import StepResult
from gpuscope.loadgen.runner import Runner, Target

ENV_PREFIX = "GPUSCOPE_TUNE_"
DEFAULT_SWEEP: Final = "max-queue-delay-ms=0.1,0.25,0.5,1,2,5"
# Flags the tuner sets itself; a sweep or --worker-args must leave them alone.
OWN_WORKER_FLAGS: Final = ("host", "port", "otlp_endpoint", "gpu_uuid", "no_tracing")


@dataclass(frozen=True)
class TuneOptions(LoadOptions):
    sweep: str = DEFAULT_SWEEP
    objective: str = "max throughput with p99 <= 100 ms"
    exporter_url: str | None = None
    worker_args: str = ""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_url("--exporter-url", self.exporter_url, "http://127.0.0.1:9420")
        try:
            objective = Objective.parse(self.objective)
        except ObjectiveError as exc:
            raise ConfigError(str(exc)) from None
        if objective.kind == "min-p99" and objective.bound not in [x.value for x in self.loads()]:
            raise ConfigError(f"--objective: '{objective}' needs that rate in --rate")
        for value in self.values():
            self.worker_argv(value, port=0, otlp="http://127.0.0.1:1/v1/traces")  # validates

    @property
    def flag(self) -> str:
        name, sep, _ = self.sweep.partition("=")
        from gpuscope.worker.config import WorkerConfig

        field = name.strip().replace("-", "_")
        if not sep:
            raise ConfigError(
                f"--sweep: expected WORKER-FLAG=V1,V2,... such as {DEFAULT_SWEEP}, "
                f"got {self.sweep!r}"
            )
        if field in OWN_WORKER_FLAGS:
            raise ConfigError(f"--sweep: --{name.strip()} is set by the tuner, not swept")
        if field not in {f.name for f in fields(WorkerConfig)}:
            raise ConfigError(
                f"--sweep: the worker has no flag --{name.strip()} (see 'gpuscope worker --help')"
            )
        return name.strip()

    def values(self) -> list[str]:
        self.flag  # noqa: B018 - validates the name first
        values = [v.strip() for v in self.sweep.partition("=")[2].split(",") if v.strip()]
        if len(values) < 2:
            raise ConfigError(f"--sweep: give at least two values to compare, got {self.sweep!r}")
        return values

    def label(self, value: str) -> str:
        return f"{self.flag}={value}"

    def worker_argv(
        self, value: str, port: int, otlp: str, gpu_uuid: str | None = None
    ) -> list[str]:
        """The worker's arguments for one value; checked by the worker's own parser."""
        from gpuscope.worker.config import parse_config

        own = {"host": "127.0.0.1", "port": port, "otlp_endpoint": otlp, "gpu_uuid": gpu_uuid}
        args = ["--host", "127.0.0.1", "--port", str(port), "--otlp-endpoint", otlp]
        args += ["--log-level", "warning", *shlex.split(self.worker_args)]
        args += [f"--{self.flag}", value] + (["--gpu-uuid", gpu_uuid] if gpu_uuid else [])
        try:
            config = parse_config(args, environ={})
        except SystemExit:
            raise ConfigError(f"--worker-args: the worker refuses {shlex.join(args)!r}") from None
        except ConfigError as exc:
            raise ConfigError(f"--sweep / --worker-args: {exc}") from None
        # Checked on the parsed flags, not the words: argparse also takes --port=N and
        # abbreviations such as --po N, which would move the worker where nobody waits.
        for flag in OWN_WORKER_FLAGS:
            if getattr(config, flag) != own.get(flag, False):
                raise ConfigError(f"--worker-args: {flags.flag_name(flag)} is set by the tuner")
        return ["worker", *args]


TUNE_HELP: Final = {
    **LOAD_HELP,
    "sweep": "the worker flag to sweep and its values: max-queue-delay-ms=0.1,0.5,1, "
    "max-batch-size=4,8,16 or batching=none,dynamic,continuous",
    "objective": "'max throughput with p99 <= X ms' or 'min p99 at rate R' (R one of --rate)",
    "exporter_url": "an exporter the worker should send spans to (default: start one)",
    "worker_args": "further worker flags for every run, e.g. '--hidden-size 128'",
}


def parse_args(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> TuneOptions:
    parser = flags.build_parser(
        TuneOptions,
        prog="gpuscope tune",
        description="Sweep one flag of the reference worker: start it at each value on a "
        "free loopback port, run the same load ladder, and name the best value under an "
        f"objective. Every flag has a {ENV_PREFIX}* environment twin.",
        help=TUNE_HELP,
        env_prefix=ENV_PREFIX,
    )
    return flags.parse_or_exit(TuneOptions, parser, argv, environ, ENV_PREFIX)


async def run_sweep(
    options: TuneOptions, stop: asyncio.Event, progress: Progress, env: str
) -> dict[str, list[StepResult]]:
    """Each value's steps, in sweep order; stops early (keeping what ran) when ``stop`` is set."""
    from gpuscope.exporter.gpu.simulated import simulated_uuid

    sweep: dict[str, list[StepResult]] = {}
    with Children() as children:
        exporter_url, gpu_uuid = options.exporter_url, None
        if exporter_url is None:
            exporter_url, gpu_uuid = await _start_exporter(children, stop), simulated_uuid(0)
        for value in options.values():
            if stop.is_set():
                break
            port = free_port()
            name = f"worker {options.label(value)}"
            argv = options.worker_argv(value, port, f"{exporter_url}/v1/traces", gpu_uuid)
            worker = children.start(name, argv)
            try:
                await wait_ready(name, f"http://127.0.0.1:{port}/readyz", worker, stop)
            except ChildFailed:
                if stop.is_set():
                    break
                raise
            target = Target(f"http://127.0.0.1:{port}/v1", exporter_url, options.model)
            runner = Runner(
                options.plan(options.label(value)), target, options.request_stream(), stop,
                tick=progress, on_step=progress.step_done,
            )  # fmt: skip
            sweep[options.label(value)] = steps = await runner.run()
            children.stop(name)
            if options.record is not None and steps:
                record.append_record(options.record, [record.step_row(s, env) for s in steps])
    return sweep


async def _start_exporter(children: Children, stop: asyncio.Event) -> str:
    port = free_port()
    args = ["exporter", "--listen", f"127.0.0.1:{port}", "--gpu-source", "simulated"]
    args += ["--gpu-interval-s", "0.5", "--log-level", "warning"]
    exporter = children.start("exporter", args)
    url = f"http://127.0.0.1:{port}"
    await wait_ready("exporter", f"{url}/readyz", exporter, stop)
    return url


def main(argv: Sequence[str]) -> int:
    options = parse_args(argv)
    if plot_unavailable(options, "gpuscope tune"):
        return 2
    progress = Progress()
    env = record.environment()
    try:
        sweep, stopped = run_with_ctrl_c(lambda stop: run_sweep(options, stop, progress, env))
    except (ChildFailed, RuntimeError) as exc:
        print(f"gpuscope tune: {exc}", file=sys.stderr)
        return 1
    steps = [step for config_steps in sweep.values() for step in config_steps]
    verdict = choose(Objective.parse(options.objective), sweep)
    stream = table_stream(options)
    # the best value as Triton's and Ray Serve's batching settings
    lines = [*verdict.lines, *batching_equivalents.for_tune(options, verdict.best)]
    print(table(steps, env) + "\n".join(lines), file=stream, flush=True)
    write_outputs(options, steps, env, with_record=False)  # the record grew value by value
    if stopped:
        print(
            "stopped (Ctrl-C, SIGTERM or SIGHUP); every process it started is stopped",
            file=sys.stderr,
        )
        return 130
    return 0 if verdict.best is not None else 1
