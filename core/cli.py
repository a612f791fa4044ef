"""The ``gpuscope`` command: dispatches to the subcommands of each package.

Subcommand modules are imported only when chosen, so ``gpuscope worker`` never
pays for aiohttp and ``gpuscope exporter`` never imports the worker's models.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

from gpuscope import __version__

# name -> (module with ``main(argv) -> int``, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "worker": ("gpuscope.worker.cli", "reference inference worker (OpenAI-compatible)"),
    "exporter": ("gpuscope.exporter.cli", "Prometheus scrape target: OTLP spans in, metrics out"),
    "doctor": ("gpuscope.exporter.doctor", "show which GPU metrics this machine supports, and why"),
    "demo": ("gpuscope.loadgen.demo", "worker + exporter + load on 127.0.0.1, simulated GPU"),
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
    lines += [f"  {name.ljust(width)}  {text}" for name, (_, text) in SUBCOMMANDS.items()]
    lines += ["", "Run 'gpuscope <command> --help' for the options of one command."]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    if args[0] in ("-V", "--version"):
        print(f"gpuscope {__version__}")
        return 0
    entry = SUBCOMMANDS.get(args[0])
    if entry is None:
        print(f"gpuscope: unknown command {args[0]!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(entry[0])
    result: int = module.main(args[1:])
    return result


if __name__ == "__main__":
    raise SystemExit(main())
