"""Fleet sizing: series, scrape size and time per node, and what Prometheus pays per series.

Run it as a script, from the repository root after ``make install``::

    nice .venv/bin/python benchmarks/fleet_sizing.py            # about 8 minutes
    nice .venv/bin/python benchmarks/fleet_sizing.py --skip-prometheus

1. **One node.** For each ``--label-sets`` K, a fresh ``gpuscope exporter`` process
   (8 simulated GPUs, loopback) is fed spans over OTLP/HTTP for K label sets:
   services x models x routes, each (service, model) pinned to one of the 8 GPUs,
   every span with all five phases, TTFT, TPOT and token counts, one batch span per
   (service, model) and round. Then ``/metrics`` is scraped ``--scrapes`` times in
   each of text, OpenMetrics (exemplars) and gzip: series per family, bytes, time to
   the last byte, and the exporter's RSS.
2. **Prometheus.** A real ``prometheus`` (``/usr/bin/prometheus``, exemplar storage
   on, the rules of ``alerts/rules/*.yml`` loaded) scrapes one exporter, fed
   continuously with ``--prom-label-sets`` label sets, as ``--prom-nodes`` nodes:
   one scrape job per node, relabelled to ``job="gpuscope"`` and an ``instance`` of
   its own, with the GPU UUIDs made distinct per node. Every ``--sample-s`` it reads
   Prometheus's own metrics: head series, RSS, Go heap in use, rule group durations.
   A Prometheus with the same rules and no targets gives the baseline to subtract.

Everything runs on 127.0.0.1 and stops on exit.
"""

from __future__ import annotations

import argparse
import gzip
import http.client
import json
import os
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from gpuscope import spans as contract
from gpuscope.contract.gpu import GPU_PREFIX
from gpuscope.contract.http import DEFAULT_PORT, METRICS_PATH, READYZ_PATH, TRACES_PATH
from gpuscope.exporter.gpu.simulated import simulated_uuid

REPO = Path(__file__).resolve().parents[1]
GPUSCOPE = REPO / ".venv" / "bin" / "gpuscope"
PROMETHEUS = "/usr/bin/prometheus"
OPENMETRICS = "application/openmetrics-text; version=1.0.0"
GPUS = 8
ROUTES = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "text_completion",
    "/v1/responses": "chat",
    "/v2/chat": "chat",
}
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{[^}]*\})?\s")


# ---------------------------------------------------------------- label sets, spans


@dataclass(frozen=True)
class Shape:
    """services x models x routes label sets; (service, model) pairs pinned to GPUs."""

    services: int
    models: int
    routes: int

    @property
    def label_sets(self) -> int:
        return self.services * self.models * self.routes

    @property
    def pairs(self) -> int:
        return self.services * self.models

    def describe(self) -> str:
        return f"{self.services} services x {self.models} models x {self.routes} routes"


def shape_for(label_sets: int) -> Shape:
    """A shape of about ``label_sets`` label sets, 2 routes and 2 models per service."""
    routes = 2 if label_sets >= 4 else 1
    models = 2 if label_sets >= 4 else 1
    services = max(1, round(label_sets / (routes * models)))
    return Shape(services, models, routes)


def _kv(key: str, value: str | int | float) -> KeyValue:
    if isinstance(value, str):
        return KeyValue(key=key, value=AnyValue(string_value=value))
    if isinstance(value, int):
        return KeyValue(key=key, value=AnyValue(int_value=value))
    return KeyValue(key=key, value=AnyValue(double_value=value))


def build_request(shape: Shape, rng: random.Random, counter: list[int]) -> bytes:
    """One span per label set, one batch span per (service, model): one OTLP request."""
    request = ExportTraceServiceRequest()
    now = time.time_ns()
    route_names = list(ROUTES)[: shape.routes]
    for s in range(shape.services):
        resource_spans = request.resource_spans.add()
        resource_spans.resource.attributes.append(_kv("service.name", f"svc-{s}"))
        scope_spans = resource_spans.scope_spans.add()
        scope_spans.scope.name = contract.INSTRUMENTATION_NAME
        for m in range(shape.models):
            uuid = simulated_uuid((s * shape.models + m) % GPUS)
            model = f"model-{m}"
            for route in route_names:
                counter[0] += 1
                n = counter[0]
                total = rng.lognormvariate(-2.0, 0.8)  # median 135 ms
                phases = [total * share for share in (0.02, 0.3, 0.1, 0.55, 0.03)]
                span = Span(
                    trace_id=n.to_bytes(16, "big"),
                    span_id=n.to_bytes(8, "big"),
                    name=f"POST {route}",
                    kind=Span.SPAN_KIND_SERVER,
                    start_time_unix_nano=now - int(total * 1e9),
                    end_time_unix_nano=now,
                )
                attributes: dict[str, str | int | float] = {
                    contract.HTTP_ROUTE: route,
                    contract.HTTP_RESPONSE_STATUS_CODE: 200,
                    contract.GEN_AI_REQUEST_MODEL: model,
                    contract.GEN_AI_OPERATION_NAME: ROUTES[route],
                    contract.GPU_UUID: uuid,
                    contract.GEN_AI_USAGE_INPUT_TOKENS: rng.randint(20, 2000),
                    contract.GEN_AI_USAGE_OUTPUT_TOKENS: rng.randint(5, 500),
                    contract.TIME_TO_FIRST_TOKEN: total * 0.3,
                    contract.TIME_PER_OUTPUT_TOKEN: total * 0.01,
                }
                for phase, seconds in zip(contract.PHASES, phases, strict=True):
                    attributes[contract.PHASE_DURATION[phase]] = seconds
                span.attributes.extend(_kv(k, v) for k, v in attributes.items())
                scope_spans.spans.append(span)
            counter[0] += 1
            batch = Span(
                trace_id=counter[0].to_bytes(16, "big"),
                span_id=counter[0].to_bytes(8, "big"),
                name=contract.BATCH_SPAN_NAME,
                kind=Span.SPAN_KIND_INTERNAL,
                start_time_unix_nano=now - 50_000_000,
                end_time_unix_nano=now,
            )
            batch.attributes.extend(
                [
                    _kv(contract.BATCH_SIZE, rng.randint(1, 16)),
                    _kv(contract.BATCH_MAX_SIZE, 16),
                    _kv(contract.GEN_AI_REQUEST_MODEL, model),
                    _kv(contract.GPU_UUID, uuid),
                ]
            )
            scope_spans.spans.append(batch)
    return bytes(request.SerializeToString())


def post_spans(base: str, body: bytes) -> None:
    request = urllib.request.Request(
        base + TRACES_PATH,
        data=body,
        headers={"Content-Type": "application/x-protobuf"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        response.read()
        if response.status != 200:
            raise RuntimeError(f"POST /v1/traces: {response.status}")


# ---------------------------------------------------------------- processes


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_http(url: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{url} not ready within {timeout_s:.0f} s")
        time.sleep(0.1)


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextmanager
def exporter(max_series: int) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    port = free_port()
    command = [
        str(GPUSCOPE), "exporter", "--gpu-source", "simulated",
        "--simulated-gpus", str(GPUS), "--listen", f"127.0.0.1:{port}",
        "--max-series", str(max_series),
    ]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_http(base + READYZ_PATH)
        yield base, process
    finally:
        stop(process)


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for {pid}")


# ---------------------------------------------------------------- scrapes


@dataclass
class Scrape:
    seconds: float
    wire_bytes: int
    body: bytes


def scrape(base: str, accept: str, gzipped: bool) -> Scrape:
    parsed = urllib.parse.urlsplit(base)
    connection = http.client.HTTPConnection(parsed.hostname or "", parsed.port, timeout=60)
    headers = {"Accept": accept}
    if gzipped:
        headers["Accept-Encoding"] = "gzip"
    started = time.perf_counter()
    connection.request("GET", METRICS_PATH, headers=headers)
    response = connection.getresponse()
    raw = response.read()
    seconds = time.perf_counter() - started
    connection.close()
    body = gzip.decompress(raw) if response.getheader("Content-Encoding") == "gzip" else raw
    return Scrape(seconds, len(raw), body)


def series_by_family(text: str) -> Counter[str]:
    """Samples per metric family (histogram _bucket/_sum/_count under the family)."""
    families: Counter[str] = Counter()
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if match:
            name = re.sub(r"_(bucket|sum|count|total|created)$", "", match.group(1))
            families[name] += 1
    return families


def _ms(values: list[float]) -> str:
    return (
        f"{statistics.median(values) * 1000:.1f} ms "
        f"({min(values) * 1000:.1f}-{max(values) * 1000:.1f})"
    )


def one_node(label_sets: int, scrapes: int, rounds: int) -> dict[str, float]:
    shape = shape_for(label_sets)
    rng = random.Random(label_sets)
    counter = [0]
    max_series = max(2000, 2 * shape.label_sets, len(contract.PHASES) * shape.pairs) + 100
    with exporter(max_series) as (base, process):
        idle_rss = rss_bytes(process.pid)
        for _ in range(rounds):
            post_spans(base, build_request(shape, rng, counter))
        text = scrape(base, "text/plain", False).body.decode()
        families = series_by_family(text)
        total = sum(families.values())
        request_side = sum(n for name, n in families.items() if not name.startswith(GPU_PREFIX))
        gpu_side = total - request_side
        print(f"\n== {shape.label_sets} label sets ({shape.describe()}), 8 simulated GPUs")
        print(f"   --max-series {max_series}; {rounds} rounds, {counter[0]} spans")
        print(f"   series (samples) in /metrics: {total}")
        print(f"     GPU families: {gpu_side}; request side and self: {request_side}")
        for name, n in families.most_common():
            if n >= 20:
                print(f"     {name:50s} {n:8d}")
        overflow = [line for line in text.splitlines() if "__overflow__" in line]
        if overflow:
            print(f"   WARNING: {len(overflow)} overflow lines")
        formats = {
            "text": ("text/plain", False),
            "OpenMetrics": (OPENMETRICS, False),
            "text+gzip": ("text/plain", True),
            "OpenMetrics+gzip": (OPENMETRICS, True),
        }
        results: dict[str, float] = {
            "label_sets": shape.label_sets,
            "series": total,
            "gpu_series": gpu_side,
        }
        times: dict[str, list[float]] = {name: [] for name in formats}
        sizes: dict[str, int] = {}
        for _ in range(scrapes):  # interleaved
            for name, (accept, gzipped) in formats.items():
                result = scrape(base, accept, gzipped)
                times[name].append(result.seconds)
                sizes[name] = result.wire_bytes
        for name in formats:
            print(f"   {name:17s} {sizes[name]:>12,d} bytes  GET {_ms(times[name])}")
            results[f"bytes_{name}"] = sizes[name]
            results[f"ms_{name}"] = statistics.median(times[name]) * 1000
        rss = rss_bytes(process.pid)
        print(f"   exporter RSS: idle {idle_rss / 2**20:.1f} MiB, now {rss / 2**20:.1f} MiB")
        results["rss_idle"] = idle_rss
        results["rss"] = rss
    return results


def per_label_set(small: dict[str, float], large: dict[str, float]) -> None:
    """Slopes between two runs: the cost of one more label set, and the fixed part."""
    delta = large["label_sets"] - small["label_sets"]
    print(
        f"\n== per 1,000 label sets (slope between {small['label_sets']:.0f} and "
        f"{large['label_sets']:.0f})"
    )
    for key, unit in (
        ("series", "series"),
        ("bytes_text", "bytes text"),
        ("bytes_OpenMetrics", "bytes OpenMetrics"),
        ("bytes_text+gzip", "bytes text gzip"),
        ("bytes_OpenMetrics+gzip", "bytes OpenMetrics gzip"),
        ("ms_text", "ms GET text"),
        ("ms_OpenMetrics", "ms GET OpenMetrics"),
        ("ms_OpenMetrics+gzip", "ms GET OpenMetrics gzip"),
        ("rss", "bytes exporter RSS"),
    ):
        slope = (large[key] - small[key]) / delta * 1000
        fixed = small[key] - slope * small["label_sets"] / 1000
        print(f"   {unit:28s} {slope:14,.1f} per 1,000   (fixed part {fixed:,.1f})")


# ---------------------------------------------------------------- Prometheus


def prometheus_config(target: str, nodes: int, rules: list[Path], interval_s: int) -> str:
    jobs = []
    for i in range(nodes):
        jobs.append(
            {
                "job_name": f"node-{i}",
                "static_configs": [{"targets": [target]}],
                "relabel_configs": [
                    {"target_label": "job", "replacement": "gpuscope"},
                    {"target_label": "instance", "replacement": f"gpu-node-{i}:{DEFAULT_PORT}"},
                ],
                "metric_relabel_configs": [
                    {
                        "source_labels": ["uuid"],
                        "regex": "(.+)",
                        "target_label": "uuid",
                        "replacement": f"$1-n{i}",
                    }
                ],
            }
        )
    config = {
        "global": {"scrape_interval": f"{interval_s}s", "evaluation_interval": "30s"},
        "rule_files": [str(path) for path in rules],
        "scrape_configs": jobs,
    }
    return json.dumps(config, indent=1)  # JSON is YAML


@contextmanager
def prometheus(config: str, workdir: Path) -> Iterator[str]:
    (workdir / "prometheus.yml").write_text(config)
    data = workdir / "data"
    shutil.rmtree(data, ignore_errors=True)
    for _ in range(5):
        port = free_port()
        log = (workdir / "prometheus.log").open("wb")
        command = [
            PROMETHEUS,
            f"--config.file={workdir / 'prometheus.yml'}",
            f"--storage.tsdb.path={data}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--enable-feature=exemplar-storage",
        ]
        process = subprocess.Popen(command, stdout=log, stderr=log)
        base = f"http://127.0.0.1:{port}"
        try:
            wait_http(base + "/-/ready")
        except RuntimeError:
            stop(process)
            log.close()
            continue
        try:
            yield base
        finally:
            stop(process)
            log.close()
        return
    raise RuntimeError(
        "prometheus did not start: " + (workdir / "prometheus.log").read_text()[-2000:]
    )


def own_metrics(base: str) -> dict[str, float]:
    with urllib.request.urlopen(base + METRICS_PATH, timeout=30) as response:
        text = response.read().decode()
    wanted = {
        "prometheus_tsdb_head_series": "head_series",
        "prometheus_tsdb_head_chunks": "head_chunks",
        "process_resident_memory_bytes": "rss",
        "go_memstats_heap_inuse_bytes": "heap_inuse",
        "prometheus_tsdb_exemplar_exemplars_in_storage": "exemplars",
        "prometheus_tsdb_exemplar_exemplars_appended_total": "exemplars_appended",
        "prometheus_tsdb_exemplar_max_exemplars": "exemplars_max",
        "prometheus_rule_group_iterations_missed_total": "missed",
    }
    found: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        name, _, rest = line.partition(" ")
        if name in wanted:
            found[wanted[name]] = float(rest.split()[0])
        if name.startswith("prometheus_rule_group_last_duration_seconds{"):
            group = re.search(r'rule_group="[^"]*;([^"]+)"', name)
            if group:
                found[f"rule:{group.group(1)}"] = float(rest.split()[0])
        if name.startswith("prometheus_rule_group_last_evaluation_samples{"):
            group = re.search(r'rule_group="[^"]*;([^"]+)"', name)
            if group:
                found[f"samples:{group.group(1)}"] = float(rest.split()[0])
    return found


def query(base: str, promql: str) -> list[float]:
    url = base + "/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(url, timeout=30) as response:
        payload = json.loads(response.read())
    return [float(item["value"][1]) for item in payload["data"]["result"]]


def recorded_by_level(base: str) -> Counter[str]:
    url = (
        base
        + "/api/v1/query?"
        + urllib.parse.urlencode({"query": 'count by (__name__) ({__name__=~".+:.+"})'})
    )
    with urllib.request.urlopen(url, timeout=30) as response:
        payload = json.loads(response.read())
    levels: Counter[str] = Counter()
    for item in payload["data"]["result"]:
        levels[item["metric"]["__name__"].split(":")[0]] += int(float(item["value"][1]))
    return levels


def rule_costs(base: str) -> dict[str, tuple[float, int]]:
    """Recording rules' last evaluation time, summed by level; alerting rules as one."""
    with urllib.request.urlopen(base + "/api/v1/rules", timeout=30) as response:
        payload = json.loads(response.read())
    costs: dict[str, tuple[float, int]] = {}
    for group in payload["data"]["groups"]:
        for rule in group["rules"]:
            if rule["type"] == "recording":
                level = rule["name"].split(":")[0]
                if "_slo_errors:ratio_rate" in rule["name"] or "_errors:ratio_rate" in rule["name"]:
                    level += " (ratio_rate*)"
            else:
                level = "alerting rules"
            seconds, count = costs.get(level, (0.0, 0))
            costs[level] = (seconds + float(rule.get("evaluationTime", 0.0)), count + 1)
    return costs


def with_prometheus(args: argparse.Namespace) -> None:
    rules = sorted((REPO / "alerts" / "rules").glob("*.yml"))
    shape = shape_for(args.prom_label_sets)
    max_series = max(2000, 2 * shape.label_sets, len(contract.PHASES) * shape.pairs) + 100
    with tempfile.TemporaryDirectory(prefix="fleet-sizing-") as tmp:
        workdir = Path(tmp)
        print(f"\n== Prometheus baseline: {', '.join(p.name for p in rules)} loaded, no targets")
        with prometheus(
            prometheus_config("127.0.0.1:1", 0, rules, args.scrape_interval_s), workdir
        ) as base:
            time.sleep(args.baseline_s)
            baseline = own_metrics(base)
        print(
            f"   head series {baseline.get('head_series', 0):.0f}, "
            f"RSS {baseline['rss'] / 2**20:.1f} MiB, "
            f"heap in use {baseline['heap_inuse'] / 2**20:.1f} MiB"
        )
        with exporter(max_series) as (exporter_base, _process):
            rng = random.Random(1)
            counter = [0]
            target = exporter_base.removeprefix("http://")
            config = prometheus_config(target, args.prom_nodes, rules, args.scrape_interval_s)
            print(
                f"\n== Prometheus: {args.prom_nodes} nodes x {shape.label_sets} label sets "
                f"({shape.describe()}), scrape every {args.scrape_interval_s} s, "
                f"rules every 30 s, {args.prom_minutes:g} min"
            )
            with prometheus(config, workdir) as base:
                started = time.monotonic()
                next_sample = started + args.sample_s
                samples: list[dict[str, float]] = []
                while time.monotonic() - started < args.prom_minutes * 60:
                    post_spans(exporter_base, build_request(shape, rng, counter))
                    if time.monotonic() >= next_sample:
                        next_sample += args.sample_s
                        sample = own_metrics(base)
                        sample["t"] = time.monotonic() - started
                        samples.append(sample)
                        print_sample(sample)
                    time.sleep(args.feed_interval_s)
                scrape_s = query(base, 'scrape_duration_seconds{job="gpuscope"}')
                scraped = query(base, 'scrape_samples_scraped{job="gpuscope"}')
                recorded = query(base, 'count({__name__=~".+:.+"})')
                raw = query(base, 'count({job="gpuscope"})')
                alerts = query(base, "count(ALERTS)")
                levels = recorded_by_level(base)
                costly = rule_costs(base)
            report_prometheus(
                baseline, samples, scrape_s, scraped, recorded, raw, alerts, counter[0]
            )
            print("   recorded series by level (the part of the name before the first ':'):")
            for level, count in levels.most_common():
                print(f"     {level:28s} {count:9.0f}")
            print("   recording rules by evaluation time, last evaluation (level: ms, rules):")
            for level, (seconds, count) in sorted(costly.items(), key=lambda kv: -kv[1][0]):
                print(f"     {level:28s} {seconds * 1000:9.1f} ms  {count:3d} rules")


def print_sample(sample: dict[str, float]) -> None:
    print(
        f"   t={sample['t']:5.0f} s  head series {sample.get('head_series', 0):9.0f}  "
        f"RSS {sample['rss'] / 2**20:7.1f} MiB  heap {sample['heap_inuse'] / 2**20:7.1f} MiB  "
        f"rules {sample.get('rule:gpuscope-bottleneck', 0) * 1000:7.1f} ms",
        flush=True,
    )


def report_prometheus(
    baseline: dict[str, float],
    samples: list[dict[str, float]],
    scrape_s: list[float],
    scraped: list[float],
    recorded: list[float],
    raw: list[float],
    alerts: list[float],
    spans: int,
) -> None:
    print(f"\n   spans sent: {spans}")
    print(f"   samples per scrape (Prometheus): {statistics.median(scraped):.0f} per target")
    print(f"   scrape_duration_seconds: {_ms(scrape_s)} over {len(scrape_s)} targets")
    print(
        f"   raw series job=gpuscope: {raw[0] if raw else 0:.0f}; "
        f"recorded series (name with ':'): {recorded[0] if recorded else 0:.0f}; "
        f"ALERTS series: {alerts[0] if alerts else 0:.0f}"
    )
    tail = samples[len(samples) // 2 :]  # the second half: every series exists
    head = statistics.median(s["head_series"] for s in tail)
    for key, name in (("rss", "RSS"), ("heap_inuse", "Go heap in use")):
        per = [
            (s[key] - baseline[key]) / (s["head_series"] - baseline.get("head_series", 0))
            for s in tail
        ]
        spread = f"{statistics.median(per):,.0f} bytes ({min(per):,.0f}-{max(per):,.0f})"
        print(f"   {name} over baseline per head series: median {spread}, second half")
    for group in sorted({k.split(":", 1)[1] for s in tail for k in s if k.startswith("rule:")}):
        durations = [s[f"rule:{group}"] for s in tail if f"rule:{group}" in s]
        evaluated = [s.get(f"samples:{group}", 0) for s in tail]
        per_series = statistics.median(durations) / head * 1e6
        out = statistics.median(evaluated)
        print(f"   rule group {group}: last duration {_ms(durations)}")
        print(f"     {out:.0f} samples out; {per_series:.2f} µs per head series")
    first, last = tail[0], tail[-1]
    appended = (last.get("exemplars_appended", 0) - first.get("exemplars_appended", 0)) / max(
        last["t"] - first["t"], 1e-9
    )
    stored, most = last.get("exemplars", 0), last.get("exemplars_max", 0)
    print(f"   exemplars in storage: {stored:.0f} of {most:.0f}; appended {appended:,.0f}/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--label-sets", default="16,200,1000", help="label sets per one-node run, comma-separated"
    )
    parser.add_argument("--scrapes", type=int, default=7, help="scrapes per format")
    parser.add_argument("--rounds", type=int, default=5, help="spans per label set before scraping")
    parser.add_argument("--skip-prometheus", action="store_true")
    parser.add_argument("--prom-nodes", type=int, default=10)
    parser.add_argument("--prom-label-sets", type=int, default=100)
    parser.add_argument("--prom-minutes", type=float, default=5.0)
    parser.add_argument("--scrape-interval-s", type=int, default=15)
    parser.add_argument("--sample-s", type=float, default=30.0)
    parser.add_argument("--feed-interval-s", type=float, default=1.0)
    parser.add_argument("--baseline-s", type=float, default=40.0)
    args = parser.parse_args()
    if not GPUSCOPE.exists():
        sys.exit(f"{GPUSCOPE} missing: run make install")
    print(f"machine: {os.cpu_count()} CPUs; {time.strftime('%Y-%m-%d %H:%M')}")
    runs = [one_node(int(k), args.scrapes, args.rounds) for k in args.label_sets.split(",")]
    if len(runs) >= 2:
        per_label_set(runs[0], runs[-1])
    if not args.skip_prometheus:
        if not Path(PROMETHEUS).exists():
            sys.exit(f"{PROMETHEUS} missing: apt-get install prometheus")
        with_prometheus(args)


if __name__ == "__main__":
    main()
