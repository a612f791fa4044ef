"""``--plot FILE.png``: latency percentiles against offered load, and the phase breakdown
stacked per step, one figure (matplotlib, the optional ``plot`` extra).

The steps are this run's, or with ``--plot-record`` every row of the ``--record`` file
(``record.plotted_steps``: one line per configuration and run). The phase axis names
whose view the phases are (``VIEWS``): gpuscope's exporter from spans, or an engine's own
counters."""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path

from gpuscope import extras
from gpuscope.loadgen.results import StepResult
from gpuscope.spans import PHASES

# What the phase axis says the means are, by --server-metrics-format (and "record": the
# rows of several runs, whose views the record does not keep).
VIEWS = {
    "exporter": "gpuscope exporter, from spans",
    "triton": "Triton's nv_inference counters",
    "vllm": "vLLM's request histograms",
    "record": "server side, each run's view",
    "none": "no server-side view",
}

# The phases' colours; one that is not here is drawn all the same.
COLORS = {
    "preprocess": "#9e9e9e",
    "queue": "#e4572e",
    "batch_wait": "#f3a712",
    "compute": "#29335c",
    "postprocess": "#669bbc",
}


def require_matplotlib() -> str | None:
    """None when matplotlib can be imported, else what to install."""
    if importlib.util.find_spec("matplotlib") is None:
        return f"matplotlib is not installed; {extras.install_hint(['plot'])}"
    return None


def plot_results(results: Sequence[StepResult], path: Path, view: str = "exporter") -> None:
    """``results`` drawn to ``path``; ``view`` a key of ``VIEWS`` (or its own words)."""
    import matplotlib

    matplotlib.use("Agg")  # files only, never a window
    import matplotlib.pyplot as plt

    figure, (latency, phases) = plt.subplots(1, 2, figsize=(11, 4.2), dpi=80)
    configs = list(dict.fromkeys(r.config for r in results))
    for number, config in enumerate(configs):
        steps = [r for r in results if r.config == config and r.latency_ms]
        x = [r.load.value for r in steps]
        points = ("p99",) if len(configs) > 1 else ("p50", "p95", "p99")  # one line each
        for point in (p for p in points if all(p in r.latency_ms for r in steps)):
            style = "-" if point == "p99" else ":"
            name = f"{config} {point}" if config else point
            y = [r.latency_ms[point] for r in steps]
            latency.plot(x, y, style, color=f"C{number}", marker="o", label=name)
    mode = results[0].load.mode
    latency.set_xlabel("clients (closed loop)" if mode == "concurrency" else "offered rate (req/s)")
    latency.set_ylabel("end-to-end latency (ms)")
    latency.set_title("p99 per configuration" if len(configs) > 1 else "latency", fontsize=9)
    latency.set_xscale("log", base=2 if mode == "concurrency" else 10)
    latency.grid(alpha=0.3)
    latency.legend(fontsize=6)
    _phase_bars(phases, results, VIEWS.get(view, view))
    figure.tight_layout()
    figure.savefig(path, pil_kwargs={"optimize": True})
    plt.close(figure)


def _short(config: str) -> str:
    """``max-queue-delay-ms=0.5`` as ``0.5``: the flag's name is in the legend already."""
    return config.partition("=")[2] or config


def _phase_bars(axes: object, results: Sequence[StepResult], view: str) -> None:
    from matplotlib.axes import Axes

    assert isinstance(axes, Axes)
    labels = [f"{_short(r.config)} {r.load.label}".strip() for r in results]
    bottoms = [0.0] * len(results)
    for phase in PHASES:
        heights = [r.server.phase_mean_ms.get(phase, 0.0) if r.server else 0.0 for r in results]
        if any(heights):
            # a phase without a colour of its own gets matplotlib's next one
            axes.bar(labels, heights, bottom=bottoms, label=phase, color=COLORS.get(phase))
            bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
    axes.set_ylabel(f"mean ms per request ({view})", fontsize=8)
    flag = results[0].config.partition("=")[0]
    by = f" (by {flag} and load)" if "=" in results[0].config else ""
    axes.set_title("where the time went" + by, fontsize=9)
    axes.tick_params(axis="x", labelsize=6, rotation=90)
    if any(bottoms):
        axes.legend(fontsize=7)
    else:
        axes.text(0.5, 0.5, "no server-side view", ha="center", transform=axes.transAxes)
