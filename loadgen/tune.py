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
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from gpuscope import flags
from gpuscope.children import (
    TRACES_PATH,
    ChildFailed,
    Children,
    free_port,
    run_until_stopped,
    simulated_gpu_uuid,
    worker_args,
)
from gpuscope.flags import ConfigError, http_url, option
from gpuscope.loadgen import batching_equivalents, record
from gpuscope.loadgen.objective import Objective, ObjectiveError, choose
from gpuscope.loadgen.options import EXPORTER_URL_EXAMPLE, LoadOptions
from gpuscope.loadgen.output import Progress, plot_unavailable, table, table_stream, write_outputs
from gpuscope.loadgen.results import StepResult
from gpuscope.loadgen.runner import Runner, Target

DEFAULT_SWEEP: Final = "max-queue-delay-ms=0.1,0.25,0.5,1,2,5"
# Worker fields the tuner sets itself; a sweep or --worker-args must leave them alone.
OWN_WORKER_FIELDS: Final = ("host", "port", "otlp_endpoint", "gpu_uuid", "no_tracing")


@dataclass(frozen=True)
class TuneOptions(
    LoadOptions,
    prog="gpuscope tune",
    description="Sweep one flag of the reference worker: start it at each value on a free "
    "loopback port, run the same load ladder, and name the best value under an objective.",
    env_prefix="GPUSCOPE_TUNE_",
):
    sweep: str = option(
        DEFAULT_SWEEP,
        help="the worker flag to sweep and its values: max-queue-delay-ms=0.1,0.5,1, "
        "max-batch-size=4,8,16 or batching=none,dynamic,continuous",
        metavar="FLAG=V1,V2,...",
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
    worker_args: str = option(
        "", help="further worker flags for every run, e.g. '--hidden-size 128'", metavar="FLAGS"
    )

    def check(self) -> None:
        super().check()
        try:
            objective = Objective.parse(self.objective)
        except ObjectiveError as exc:
            raise ConfigError(str(exc)) from None
        if objective.kind == "min-p99" and objective.bound not in [x.value for x in self.loads()]:
            raise ConfigError(
                f"{_flag('objective')}: '{objective}' needs that rate in {_flag('rate')}"
            )
        for value in self.values():
            self.worker_argv(value, port=0, otlp="http://127.0.0.1:1/v1/traces")  # validates

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
        self.flag  # noqa: B018 - validates the name first
        values = [v.strip() for v in self.sweep.partition("=")[2].split(",") if v.strip()]
        if len(values) < 2:
            raise ConfigError(
                f"{_flag('sweep')}: give at least two values to compare, got {self.sweep!r}"
            )
        return values

    def label(self, value: str) -> str:
        return f"{self.flag}={value}"

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
    options: TuneOptions, stop: asyncio.Event, progress: Progress, env: str
) -> dict[str, list[StepResult]]:
    """Each value's steps, in sweep order; stops early (keeping what ran) when ``stop`` is set."""
    sweep: dict[str, list[StepResult]] = {}
    with Children() as children:
        exporter_url, gpu_uuid = options.exporter_url, None
        if exporter_url is None:
            exporter = children.simulated_exporter()
            await exporter.wait_ready(stop)
            exporter_url, gpu_uuid = exporter.url, simulated_gpu_uuid(0)
        for value in options.values():
            if stop.is_set():
                break
            port = free_port()
            name = f"worker {options.label(value)}"
            argv = options.worker_argv(value, port, exporter_url + TRACES_PATH, gpu_uuid)
            worker = children.adopt(name, argv, port)
            try:
                await worker.wait_ready(stop)
            except ChildFailed:
                if stop.is_set():
                    break
                raise
            target = Target(f"{worker.url}/v1", exporter_url, options.model)
            runner = Runner(
                options.plan(options.label(value)), target, options.request_stream(), stop,
                tick=progress, on_step=progress.step_done,
            )  # fmt: skip
            sweep[options.label(value)] = steps = await runner.run()
            children.stop(name)
            if options.record is not None and steps:
                record.append_record(options.record, [record.step_row(s, env) for s in steps])
    return sweep


def main(argv: Sequence[str]) -> int:
    options = flags.parse(TuneOptions, argv)
    if plot_unavailable(options, "gpuscope tune"):
        return 2
    progress = Progress()
    env = record.environment()
    try:
        sweep, stopped = run_until_stopped(lambda stop: run_sweep(options, stop, progress, env))
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
