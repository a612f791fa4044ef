"""Cost of the GPU side of a scrape, and proof that sampling never delays it.

Measured in one run, in-process, 8 simulated GPUs:

* ``render``: ``generate_latest`` of a registry holding only ``GpuCollector``
  (every GPU family, from the poller's cached snapshot);
* ``render while sampling hangs``: the same while the poller thread is stuck inside
  ``sample()`` (a hung NVML call), to show the scrape does not wait on it;
* ``sample``: one ``SimulatedSource.sample()`` of 8 GPUs (poller thread cost).

    .venv/bin/python benchmarks/gpu_scrape.py [--rounds 7] [--scrapes 200]
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from collections.abc import Callable, Sequence

from prometheus_client import CollectorRegistry, generate_latest

from gpuscope.exporter.gpu.collector import GpuCollector
from gpuscope.exporter.gpu.poller import GpuPoller
from gpuscope.exporter.gpu.scenario import parse_scenario
from gpuscope.exporter.gpu.simulated import SimulatedSource
from gpuscope.exporter.gpu.source import GpuDevice, GpuReading

GPUS = 8


class HangingSource:
    """Samples once, then hangs in ``sample()`` until released."""

    name = "hanging"

    def __init__(self, inner: SimulatedSource) -> None:
        self.inner = inner
        self.hanging = threading.Event()
        self.release = threading.Event()
        self.calls = 0

    def devices(self) -> Sequence[GpuDevice]:
        return self.inner.devices()

    def sample(self) -> Sequence[GpuReading]:
        self.calls += 1
        if self.calls > 1:
            self.hanging.set()
            self.release.wait()
        return self.inner.sample()

    def close(self) -> None:
        self.release.set()


def per_call_us(action: Callable[[], object], calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        action()
    return (time.perf_counter() - start) / calls * 1e6


def summary(name: str, values: list[float]) -> str:
    spread = f"{min(values):.1f}-{max(values):.1f}"
    return f"{name:<32} median {statistics.median(values):8.1f} us   range {spread} us"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--scrapes", type=int, default=200)
    args = parser.parse_args(argv)

    scenario = parse_scenario({"events": [{"at": 0, "gpu": "all", "fault": "load", "level": 0.7}]})
    calm = SimulatedSource(GPUS, scenario)
    calm_poller = GpuPoller(calm, 1.0)
    calm_poller.poll_once()
    calm_registry = CollectorRegistry()
    calm_registry.register(GpuCollector(calm_poller))

    hanging = HangingSource(SimulatedSource(GPUS, scenario))
    hanging_poller = GpuPoller(hanging, 0.001)
    hanging_poller.start()
    hanging.hanging.wait()  # the poller thread is now stuck inside sample()
    hanging_registry = CollectorRegistry()
    hanging_registry.register(GpuCollector(hanging_poller))

    render, render_hung, sample = [], [], []
    for _ in range(args.rounds):
        render.append(per_call_us(lambda: generate_latest(calm_registry), args.scrapes))
        render_hung.append(per_call_us(lambda: generate_latest(hanging_registry), args.scrapes))
        sample.append(per_call_us(calm.sample, args.scrapes))
    hanging.release.set()
    hanging_poller.stop()

    size = len(generate_latest(calm_registry))
    print(f"{GPUS} simulated GPUs, {args.rounds} rounds x {args.scrapes} calls; body {size} bytes")
    print(summary("render", render))
    print(summary("render while sampling hangs", render_hung))
    print(summary("sample (poller thread)", sample))
    ratio = statistics.median(render_hung) / statistics.median(render)
    print(f"ratio render while hung / render: {ratio:.2f}")


if __name__ == "__main__":
    main()
