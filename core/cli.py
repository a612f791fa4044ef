"""The ``gpuscope`` command: dispatches to the subcommands of each package.

Subcommand modules are imported only when chosen, so ``gpuscope worker`` never
pays for aiohttp and ``gpuscope exporter`` never imports the worker's models.
Each subcommand needs an extra of the distribution; when one is not installed, the
command says which to install instead of failing with an ``ImportError``.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from typing import NamedTuple

from gpuscope import __version__, extras


class Subcommand(NamedTuple):
    module: str  # has ``main(argv) -> int``
    extras: tuple[str, ...]  # what ``pip install 'gpuscope[...]'`` it needs
    help: str


SUBCOMMANDS: dict[str, Subcommand] = {
    "worker": Subcommand(
        "gpuscope.worker.cli", ("worker",), "reference inference worker (OpenAI-compatible)"
    ),
    "exporter": Subcommand(
        "gpuscope.exporter.cli",
        ("exporter",),
        "Prometheus scrape target: OTLP spans in, metrics out",
    ),
    "doctor": Subcommand(
        "gpuscope.exporter.doctor",
        ("exporter",),
        "show which GPU metrics this machine supports, and why",
    ),
    "demo": Subcommand(
        "gpuscope.loadgen.demo",
        ("exporter", "worker", "loadgen"),
        "worker + exporter + load on 127.0.0.1, simulated GPU",
    ),
    "loadgen": Subcommand(
        "gpuscope.loadgen.cli",
        ("loadgen",),
        "load ladder on an OpenAI endpoint; where the time went",
    ),
    "tune": Subcommand(
        "gpuscope.loadgen.tune",
        ("exporter", "worker", "loadgen"),
        "sweep one flag of the worker or any engine (--command), name the best",
    ),
}


def usage() -> str:
    width = max(len(name) for name in SUBCOMMANDS)
    lines = [
        "usage: gpuscope <command> [options]",
        "",
        "Where did each request's milliseconds go, and what was the GPU doing meanwhile?",
        "",
        "commands:",
    ]
    lines += [f"  {name.ljust(width)}  {command.help}" for name, command in SUBCOMMANDS.items()]
    lines += [
        "",
        "Run 'gpuscope <command> --help' for the options of one command;"
        " 'gpuscope --version' prints the version.",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    if args[0] in ("-V", "--version"):
        print(f"gpuscope {__version__}")
        return 0
    command = SUBCOMMANDS.get(args[0])
    if command is None:
        print(f"gpuscope: unknown command {args[0]!r}\n\n{usage()}", file=sys.stderr)
        return 2
    absent = extras.missing(command.extras)
    if absent:
        return _not_installed(args[0], command, ", ".join(absent))
    try:
        module = importlib.import_module(command.module)
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.partition(".")[0] == "gpuscope":
            raise
        return _not_installed(args[0], command, exc.name)
    result: int = module.main(args[1:])
    return result


def _not_installed(name: str, command: Subcommand, what: str) -> int:
    quoted = ", ".join(f"'{extra}'" for extra in command.extras)
    noun, pronoun = ("extra", "it") if len(command.extras) == 1 else ("extras", "them")
    print(
        f"gpuscope {name}: missing {what} from the {quoted} {noun}; "
        f"install {pronoun} with: {extras.install_hint(command.extras)}",
        file=sys.stderr,
    )
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
