"""The long fuzz run of OTLP decode + aggregation (the test suite runs a short one).

Run it as a script (see exporter_bench.py for why)::

    nice .venv/bin/python benchmarks/otlp_fuzz.py [--cases 100000] [--http-cases 2000]

1. in process: ``--cases`` requests from ``tests/support/otlp_cases.py`` (valid and
   mutated, protobuf and JSON, some gzipped; durations at the edges, 1.7e308 and just
   past a day among them; one in ten a valid request just under, at or over the span
   cap, of empty spans, spans or empty groups) through the exporter's decoding with its
   span and attribute caps (small ones, so they are reached) and
   ``SpanAggregator.ingest``, checking the invariants of ``check_case`` (a request of
   known counts is refused exactly when it passes a cap); every 10,000 cases every
   histogram ``_sum`` is checked finite (and at most a day per observation for the
   duration families), and the histograms are rendered and parsed back.
2. over HTTP: ``--http-cases`` more posted to a real exporter on 127.0.0.1; every
   refused request must show in ``gpuscope_otlp_requests_rejected_total`` and no
   answer may be a 5xx.

Prints cases, uncaught exceptions (must be 0), refusals by reason, span counts, time.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
import traceback
from collections import Counter
from pathlib import Path

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from gpuscope.contract.exporter import OTLP_REQUESTS_REJECTED
from gpuscope.contract.http import METRICS_PATH, TRACES_PATH
from gpuscope.exporter.http.render import render_histograms
from gpuscope.exporter.ingest.aggregator import SpanAggregator
from gpuscope.exporter.service import start_exporter
from support.otlp_cases import capped_config, check_case, check_sums, random_case


def run_in_process(cases: int, seed: int) -> int:
    rng = random.Random(seed)
    aggregator = SpanAggregator(max_series=200)
    refused: Counter[str] = Counter()
    spans = Counter[str]()
    failures: Counter[str] = Counter()
    started = time.perf_counter()
    for number in range(1, cases + 1):
        case = random_case(rng)
        try:
            outcome = check_case(aggregator, case)
        except Exception as exc:  # a defect: count it, show the first few
            key = f"{case.kind}: {type(exc).__name__}: {str(exc)[:120]}"
            if not failures[key]:
                traceback.print_exc()
            failures[key] += 1
            continue
        if outcome.rejected_reason is not None:
            refused[outcome.rejected_reason] += 1
        spans.update(
            received=outcome.received,
            aggregated=outcome.aggregated,
            rejected=outcome.spans_rejected,
        )
        if number % 10_000 == 0:
            check_sums(aggregator)
            text = render_histograms(aggregator.histograms, openmetrics=False)
            list(text_string_to_metric_families(text))
    elapsed = time.perf_counter() - started
    print(f"in process: {cases} cases in {elapsed:.1f} s ({cases / elapsed:.0f}/s), seed {seed}")
    print(f"  uncaught exceptions: {sum(failures.values())}")
    for key, count in failures.most_common():
        print(f"    {count} x {key}")
    print(f"  requests refused: {sum(refused.values())} {dict(sorted(refused.items()))}")
    print(f"  requests decoded: {cases - sum(refused.values()) - sum(failures.values())}")
    print(f"  spans: {dict(spans)}")
    return sum(failures.values())


async def run_over_http(cases: int, seed: int) -> int:
    rng = random.Random(seed + 1)
    config = capped_config()  # the caps of the cases, small enough to be reached
    exporter = await start_exporter(config)
    statuses: Counter[int] = Counter()
    started = time.perf_counter()
    try:
        async with aiohttp.ClientSession() as session:
            for _ in range(cases):
                case = random_case(rng)
                headers = {"Content-Type": case.media}
                if case.encoding:
                    headers["Content-Encoding"] = case.encoding
                url = exporter.url + TRACES_PATH
                async with session.post(url, data=case.body, headers=headers) as response:
                    await response.read()
                    statuses[response.status] += 1
            async with session.get(exporter.url + METRICS_PATH) as response:
                text = await response.text()
    finally:
        await exporter.stop()
    counted = sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == OTLP_REQUESTS_REJECTED.sample_name
    )
    refused = sum(n for status, n in statuses.items() if status >= 400)
    elapsed = time.perf_counter() - started
    print(
        f"over HTTP: {cases} requests in {elapsed:.1f} s, statuses {dict(sorted(statuses.items()))}"
    )
    print(f"  refused {refused}, counted in {OTLP_REQUESTS_REJECTED.sample_name} {counted:.0f}")
    server_errors = sum(n for status, n in statuses.items() if status >= 500)
    return server_errors + (refused != counted)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=100_000)
    parser.add_argument("--http-cases", type=int, default=2_000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    problems = run_in_process(args.cases, args.seed)
    problems += asyncio.run(run_over_http(args.http_cases, args.seed))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
