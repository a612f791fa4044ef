"""Generate the committed Grafana dashboards (``dashboards/json/*.json``).

    python dashboards/build.py            # rewrite the JSON
    python dashboards/build.py --check    # exit 1 if the committed JSON is stale

Run by ``make dashboards`` (``python -m dashboards.build`` from the repository root
works too). Needs the pinned ``grafana-foundation-sdk`` (dev extra).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

if __name__ == "__main__" and not __package__:
    # Run as a file, Python puts this folder first on sys.path; the builders are the
    # package ``dashboards`` of the repository root, which takes its place.
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from grafana_foundation_sdk.builders.dashboard import Dashboard

from dashboards import board_exporter, board_gpu, board_latency, board_where
from dashboards.panels import render

OUTPUT = Path(__file__).parent / "json"
BOARDS: dict[str, Callable[[], Dashboard]] = {
    "inference-latency.json": board_latency.build,
    "gpu.json": board_gpu.build,
    "where-did-the-time-go.json": board_where.build,
    "exporter-health.json": board_exporter.build,
}


def rendered() -> dict[str, str]:
    """File name -> JSON text of every dashboard."""
    return {name: render(build()) for name, build in BOARDS.items()}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the JSON is stale")
    parser.add_argument("--output", type=Path, default=OUTPUT, help="folder to write to")
    args = parser.parse_args(argv)
    stale = []
    for name, text in rendered().items():
        path = args.output / name
        if args.check:
            if not path.is_file() or path.read_text() != text:
                stale.append(name)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    if stale:
        print(f"stale: {', '.join(stale)}; run 'make dashboards'", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
