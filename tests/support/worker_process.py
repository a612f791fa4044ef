"""The worker as a real process (``gpuscope worker``, or a slow-device variant), for
tests of signals, exit codes, logs and memory.

Run as a script, this module is the slow-device worker: ``gpuscope worker``'s flags
and serving, with a generator that takes ``--step-ms`` per iteration (a slow GPU), so
that requests are reliably still running when a test sends SIGTERM.
"""

from __future__ import annotations

import logging
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from gpuscope import flags
from gpuscope.children import worker_args
from gpuscope.worker.app import create_app
from gpuscope.worker.backends import numpy_models
from gpuscope.worker.cli import serve
from gpuscope.worker.config import WorkerConfig
from gpuscope.worker.kv_cache import BlockPool, SequenceState
from gpuscope.worker.model_api import Generator

_LISTENING = re.compile(r"Uvicorn running on (http://127\.0\.0\.1:\d+)")


@dataclass
class WorkerProcess:
    process: subprocess.Popen[str]
    url: str = ""
    lines: list[str] = field(default_factory=list)
    started: threading.Event = field(default_factory=threading.Event)

    def output(self) -> str:
        return "\n".join(self.lines)

    def peak_rss_bytes(self) -> int:
        """The process's peak resident memory so far (VmHWM)."""
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        match = re.search(r"^VmHWM:\s+(\d+) kB", status, re.MULTILINE)
        assert match is not None, status
        return int(match.group(1)) * 1024

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))
            found = _LISTENING.search(line)
            if found:
                self.url = found.group(1)
                self.started.set()


@contextmanager
def worker_process(
    args: Sequence[str], *, slow_step_ms: float | None = None
) -> Iterator[WorkerProcess]:
    """Start the worker on 127.0.0.1 port 0 with ``args``; yields once it listens."""
    subcommand, *worker_flags = worker_args(0, no_tracing=True, device="cpu")
    if slow_step_ms is None:
        command = [sys.executable, "-m", "gpuscope", subcommand]
    else:
        command = [sys.executable, __file__, "--step-ms", str(slow_step_ms)]
    command += [*worker_flags, *args]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    worker = WorkerProcess(process)
    reader = threading.Thread(target=worker._read, daemon=True)
    reader.start()
    try:
        if not worker.started.wait(60):
            raise RuntimeError(f"the worker did not start:\n{worker.output()}")
        yield worker
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(30)
        reader.join(10)
        if process.stdout is not None:
            process.stdout.close()


class WrappedGenerator:
    """``inner`` as it is, except that ``before_step`` runs before every iteration."""

    def __init__(self, inner: Generator) -> None:
        self.inner = inner

    @property
    def max_context(self) -> int:
        return self.inner.max_context

    @property
    def kv_pool(self) -> BlockPool:
        return self.inner.kv_pool

    def start(self, prompt: Sequence[int]) -> SequenceState:
        return self.inner.start(prompt)

    def step(self, sequences: Sequence[SequenceState]) -> list[int]:
        self.before_step()
        return self.inner.step(sequences)

    def before_step(self) -> None:
        pass


class SlowGenerator(WrappedGenerator):
    """A generator on a slow device: every iteration takes ``step_s`` longer."""

    def __init__(self, inner: Generator, step_s: float) -> None:
        super().__init__(inner)
        self.step_s = step_s

    def before_step(self) -> None:
        time.sleep(self.step_s)  # timed: a slow device step


def _slow_worker(argv: list[str]) -> int:
    """``gpuscope worker`` (its flags, its serving) with the generator slowed down."""
    at = argv.index("--step-ms")
    step_s = float(argv[at + 1]) / 1000
    config = flags.parse(WorkerConfig, argv[:at] + argv[at + 2 :])
    logging.basicConfig(level="INFO", format="%(levelname)s %(name)s: %(message)s")
    embedding, generator = numpy_models(config)
    app = create_app(config, embedding_model=embedding, generator=SlowGenerator(generator, step_s))
    serve(config, app)
    return 0


if __name__ == "__main__":
    sys.exit(_slow_worker(sys.argv[1:]))
