"""Fast text rendering of the request histograms for ``/metrics``.

prometheus_client's writers cost about 10 µs per sample line; 2,000 label sets of a
20-bucket histogram would hold the event loop for almost half a second. Here each
series' label text is built once per scrape and every line is one f-string. The
output is the same exposition as ``ExporterCollector`` yields through
prometheus_client (a test parses both and compares them sample by sample); the
other families (GPU, self metrics, tokens) still go through prometheus_client.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import CollectorRegistry

from gpuscope.exporter.series import HistogramFamily

OPENMETRICS_EOF = b"# EOF\n"


def render_exposition(
    registry: CollectorRegistry, histograms: Iterable[HistogramFamily], accept: str
) -> tuple[bytes, str]:
    """``(body, content type)`` of a scrape: ``registry`` through prometheus_client,
    then the histograms through ``render_histograms``, in the format ``accept`` asks for."""
    encoder, content_type = choose_encoder(accept)
    openmetrics = content_type.startswith("application/openmetrics-text")
    output = encoder(_WithUnits(registry) if openmetrics else registry)
    fast = render_histograms(histograms, openmetrics=openmetrics).encode()
    if openmetrics:  # one "# EOF" at the very end
        return output.removesuffix(OPENMETRICS_EOF) + fast + OPENMETRICS_EOF, content_type
    return output + fast, content_type


# Base units that gpuscope's metric names end with; OpenMetrics' ``# UNIT`` line names
# the suffix (Prometheus refuses a unit that is not one).
_UNITS = ("seconds", "bytes", "joules", "hertz", "watts", "celsius", "ratio")


def unit_of(name: str) -> str:
    """The unit suffix of a metric name (``_total`` aside), or "" for none."""
    base = name.removesuffix("_total")
    return next((unit for unit in _UNITS if base.endswith("_" + unit)), "")


class _WithUnits:
    """``registry``'s families, each given the unit its name ends with (OpenMetrics)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

    def collect(self) -> Iterator[Metric]:
        for metric in self.registry.collect():
            if not metric.unit:
                metric.unit = unit_of(metric.name)
            yield metric


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def render_histograms(families: Iterable[HistogramFamily], *, openmetrics: bool) -> str:
    """Prometheus text (0.0.4) or OpenMetrics lines, exemplars in OpenMetrics only."""
    out: list[str] = []
    for family in families:
        name = family.name
        out.append(f"# HELP {name} {_help(family.documentation)}\n# TYPE {name} histogram\n")
        if openmetrics and unit_of(name):
            out.append(f"# UNIT {name} {unit_of(name)}\n")
        bounds = [repr(b) for b in family.bounds] + ["+Inf"]
        names = family.label_names
        for labels, series in family.items():
            text = ",".join(f'{n}="{_escape(v)}"' for n, v in zip(names, labels, strict=True))
            prefix = f"{name}_bucket{{{text},le=" if text else f"{name}_bucket{{le="
            cumulative = 0
            for bound, count, span, value in zip(
                bounds, series.counts, series.exemplar_spans, series.exemplar_values, strict=True
            ):
                cumulative += count
                if openmetrics and span is not None:
                    trace_id, span_id, end_ns = span
                    out.append(
                        f'{prefix}"{bound}"}} {cumulative} # {{trace_id="{trace_id.hex()}",'
                        f'span_id="{span_id.hex()}"}} {value!r} {end_ns / 1e9!r}\n'
                    )
                else:
                    out.append(f'{prefix}"{bound}"}} {cumulative}\n')
            braces = f"{{{text}}}" if text else ""
            out.append(f"{name}_count{braces} {cumulative}\n{name}_sum{braces} {series.sum!r}\n")
    return "".join(out)
