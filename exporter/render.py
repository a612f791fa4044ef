"""Fast text rendering of the request histograms for ``/metrics``.

prometheus_client's writers cost about 10 µs per sample line; 2,000 label sets of a
20-bucket histogram would hold the event loop for almost half a second. Here each
series' label text is built once per scrape and every line is one f-string. The
output is the same exposition as prometheus_client's writers give (a test parses
both and compares them sample by sample); the other families (GPU, self metrics,
tokens) go through prometheus_client.

The ``/metrics`` handler calls this in a worker thread while the event loop goes on
ingesting; ``HistogramSeries.read`` gives it a consistent copy of each series.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import CollectorRegistry

from gpuscope.exporter.definitions import unit_of
from gpuscope.exporter.series import HistogramFamily, HistogramSeries

OPENMETRICS_EOF = b"# EOF\n"
CHUNK_BYTES = 1 << 20


def render_chunks(
    registry: CollectorRegistry,
    histograms: Iterable[HistogramFamily],
    accept: str,
    chunk_bytes: int = CHUNK_BYTES,
) -> tuple[list[bytes], str]:
    """The scrape as pieces of about ``chunk_bytes``. Joining and encoding 100+ MiB at
    once holds the GIL for a tenth of a second, long enough to stall the event loop
    while this runs in a worker thread; a chunk at a time never does."""
    encoder, content_type = choose_encoder(accept)
    openmetrics = content_type.startswith("application/openmetrics-text")
    source = _WithUnits(registry) if openmetrics else registry
    chunks = [encoder(source).removesuffix(OPENMETRICS_EOF)]
    pending: list[str] = []
    size = 0
    for piece in _histogram_pieces(histograms, openmetrics):
        pending.append(piece)
        size += len(piece)
        if size >= chunk_bytes:
            chunks.append("".join(pending).encode())
            pending, size = [], 0
    chunks.append("".join(pending).encode() + (OPENMETRICS_EOF if openmetrics else b""))
    return chunks, content_type


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
    return "".join(_histogram_pieces(families, openmetrics))


def _histogram_pieces(families: Iterable[HistogramFamily], openmetrics: bool) -> Iterator[str]:
    """Each family's header, then one string per series."""
    for family in families:
        name = family.name
        yield f"# HELP {name} {_help(family.documentation)}\n# TYPE {name} histogram\n"
        if openmetrics and unit_of(name):
            yield f"# UNIT {name} {unit_of(name)}\n"
        bounds = [repr(b) for b in family.bounds] + ["+Inf"]
        names = family.label_names
        for labels, series in family.items():
            text = ",".join(f'{n}="{_escape(v)}"' for n, v in zip(names, labels, strict=True))
            yield _series_text(name, text, bounds, series, openmetrics)


def _series_text(
    name: str, labels: str, bounds: list[str], series: HistogramSeries, openmetrics: bool
) -> str:
    """One series' lines as one string: few long-lived objects, so a scrape of 100,000
    series does not set off garbage collections that pause every thread."""
    prefix = f"{name}_bucket{{{labels},le=" if labels else f"{name}_bucket{{le="
    counts, total, spans, values = series.read()
    lines = []
    cumulative = 0
    for bound, count, span, value in zip(bounds, counts, spans, values, strict=True):
        cumulative += count
        if openmetrics and span is not None:
            trace_id, span_id, end_ns = span
            lines.append(
                f'{prefix}"{bound}"}} {cumulative} # {{trace_id="{trace_id.hex()}",'
                f'span_id="{span_id.hex()}"}} {value!r} {end_ns / 1e9!r}\n'
            )
        else:
            lines.append(f'{prefix}"{bound}"}} {cumulative}\n')
    braces = f"{{{labels}}}" if labels else ""
    lines.append(f"{name}_count{braces} {cumulative}\n{name}_sum{braces} {total!r}\n")
    return "".join(lines)
