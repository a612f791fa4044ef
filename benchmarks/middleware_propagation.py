"""Cost per request of passing the context on: choosing the parent, rewriting headers.

For a request that carries ``traceparent``, ``tracestate`` and ``baggage``, the
middleware picks its parent (the active span, else the caller's headers) and hands
the application a scope whose propagation headers point at its own span. This times
the two steps alone, through the globally configured propagator (W3C trace context
and baggage), with a realistic header list of eight entries.

    .venv/bin/python benchmarks/middleware_propagation.py [--rounds 7]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from gpuscope.middleware.asgi import _parent_context, _with_propagation_headers
from gpuscope.middleware.types import Scope

CALLS = 20_000


def request_scope() -> Scope:
    headers = [
        (b"host", b"worker:8000"),
        (b"user-agent", b"OpenAI/Python 1.60.0"),
        (b"accept", b"application/json"),
        (b"content-type", b"application/json"),
        (b"content-length", b"120"),
        (b"traceparent", b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
        (b"tracestate", b"shop=checkout"),
        (b"baggage", b"user=alice,tenant=blue"),
    ]
    return {"type": "http", "method": "POST", "path": "/v1/embeddings", "headers": headers}


def per_call_us(step: Callable[[], object]) -> float:
    started = time.process_time()
    for _ in range(CALLS):
        step()
    return (time.process_time() - started) / CALLS * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    rounds = parser.parse_args().rounds
    scope = request_scope()
    span = TracerProvider().get_tracer("bench").start_span("POST /v1/embeddings")
    context = trace.set_span_in_context(span, _parent_context(scope))
    steps: dict[str, Callable[[], object]] = {
        "choose the parent (extract)": lambda: _parent_context(scope),
        "rewrite propagation headers": lambda: _with_propagation_headers(scope, context),
    }
    print(f"CPU µs per request, median (min–max) of {rounds} rounds x {CALLS} calls")
    for name, step in steps.items():
        times = [per_call_us(step) for _ in range(rounds)]
        median = statistics.median(times)
        print(f"{name:32} {median:6.2f} ({min(times):.2f}–{max(times):.2f})")


if __name__ == "__main__":
    main()
