"""Where gpuscope's middleware overhead goes: ``middleware_overhead.py``'s gpuscope case
(phase children off, spans discarded) with one piece taken out at a time, against the
bare app and OpenTelemetry's server span, interleaved in each round.

The pieces: rewriting the propagation headers the app sees (``no-rewrite``), the request
attributes (``no-request-attributes``), the batch span (``no-batch-span``), and the whole
batch path, marks and ``BatchRecorder`` included (``no-batch``: the app serves the same
batches without telling gpuscope). What a piece costs is the full case's overhead less
that row's. Each piece is replaced by a stand-in for the length of its measurement only;
the pieces are features, so this measures, it does not propose.

    nice .venv/bin/python benchmarks/middleware_ablation.py [--requests 2000] [--rounds 7]
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import middleware_overhead
from middleware_overhead import BATCH_SIZE, make_app, measure

from gpuscope.middleware import GpuscopeMiddleware, asgi, batch

# name -> (the benchmark's case, the stand-ins: (owner, attribute, replacement))
PIECES: dict[str, tuple[str, list[tuple[Any, str, Any]]]] = {
    "bare": ("bare", []),
    "otel-server-span": ("otel-asgi-server", []),
    "gpuscope": ("gpuscope", []),
    "no-rewrite": ("gpuscope", [(asgi, "_scope_for_app", lambda scope, context: scope)]),
    "no-request-attributes": ("gpuscope", [(asgi, "request_attributes", lambda scope: {})]),
    "no-batch-span": ("gpuscope", [(batch.Batch, "_emit_span", lambda *args: None)]),
    "no-batch": ("gpuscope-without-batches", []),
}


@contextmanager
def stand_ins(replacements: list[tuple[Any, str, Any]]) -> Iterator[None]:
    originals = [(owner, name, getattr(owner, name)) for owner, name, _ in replacements]
    for owner, name, replacement in replacements:
        setattr(owner, name, replacement)
    try:
        yield
    finally:
        for owner, name, original in originals:
            setattr(owner, name, original)


def add_unbatched_case() -> None:
    """``gpuscope-without-batches``: the same batching app, told nothing of gpuscope."""
    original = middleware_overhead.configurations

    def build(provider: Any) -> GpuscopeMiddleware:
        return GpuscopeMiddleware(make_app(1, None), tracer_provider=provider, phase_spans=False)

    def with_unbatched(chunks: int) -> dict[str, tuple[Any, bool]]:
        return {**original(chunks), "gpuscope-without-batches": (build, True)}

    middleware_overhead.configurations = with_unbatched


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    if args.requests % BATCH_SIZE:
        parser.error(f"--requests must be a multiple of {BATCH_SIZE}")
    add_unbatched_case()
    samples: dict[str, list[float]] = {name: [] for name in PIECES}
    for _ in range(args.rounds):  # interleaved, so machine noise hits all alike
        for name, (case, replacements) in PIECES.items():
            with stand_ins(replacements):
                samples[name].append(measure(case, 1, False, args.requests))
    bare = statistics.median(samples["bare"])
    otel = statistics.median(samples["otel-server-span"]) - bare
    full = statistics.median(samples["gpuscope"]) - bare
    print(f"CPU µs per request, median of {args.rounds} rounds x {args.requests} requests")
    print(f"{'case':24} {'µs/request':>10} {'overhead':>9} {'x OTel':>7} {'piece costs':>12}")
    for name, values in samples.items():
        over = statistics.median(values) - bare
        piece = f"{full - over:12.1f}" if name.startswith("no-") else " " * 12
        ratio = f"{over / otel:7.2f}" if name != "bare" else " " * 7
        print(f"{name:24} {statistics.median(values):10.1f} {over:9.1f} {ratio} {piece}")


if __name__ == "__main__":
    main()
