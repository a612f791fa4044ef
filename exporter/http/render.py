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

import zlib
from collections.abc import Callable, Iterable, Iterator

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import CollectorRegistry

from gpuscope.contract.labels import OMIT_EMPTY
from gpuscope.contract.rows import unit_of
from gpuscope.exporter.ingest.series import HistogramFamily, HistogramSeries
from gpuscope.exposition import choose_format

OPENMETRICS_EOF = b"# EOF\n"
CHUNK_BYTES = 1 << 20
# A piece of a scrape as it is streamed: what one connection holds while its client
# reads (see ``scrape_pieces``).
STREAM_PIECE_BYTES = 256 * 1024


def render_chunks(
    registry: CollectorRegistry,
    histograms: Iterable[HistogramFamily],
    accept: str,
    chunk_bytes: int = CHUNK_BYTES,
) -> tuple[list[bytes], str]:
    """The scrape as pieces of about ``chunk_bytes``. Joining and encoding 100+ MiB at
    once holds the GIL for a tenth of a second, long enough to stall the event loop
    while this runs in a worker thread; a chunk at a time never does."""
    content_type = choose_format(accept)[1]
    return list(iter_chunks(registry, histograms, accept, chunk_bytes)), content_type


def content_type_for(accept: str) -> str:
    """The content type of a scrape asked for with ``accept``."""
    return choose_format(accept)[1]


def iter_chunks(
    registry: CollectorRegistry,
    histograms: Iterable[HistogramFamily],
    accept: str,
    chunk_bytes: int = CHUNK_BYTES,
) -> Iterator[bytes]:
    """``render_chunks``' pieces, each made when the one before has been taken."""
    encoder, content_type = choose_format(accept)
    openmetrics = content_type.startswith("application/openmetrics-text")
    source = _WithUnits(registry) if openmetrics else registry
    yield encoder(source).removesuffix(OPENMETRICS_EOF)
    pending: list[str] = []
    size = 0
    for piece in _histogram_pieces(histograms, openmetrics):
        pending.append(piece)
        size += len(piece)
        if size >= chunk_bytes:
            yield "".join(pending).encode()
            pending, size = [], 0
    yield "".join(pending).encode() + (OPENMETRICS_EOF if openmetrics else b"")


def scrape_pieces(
    registry: CollectorRegistry,
    histograms: Iterable[HistogramFamily],
    accept: str,
    compress: bool,
    piece_bytes: int = STREAM_PIECE_BYTES,
) -> Iterator[bytes]:
    """What ``/metrics`` streams: the scrape (gzipped when ``compress``) as non-empty
    pieces of about ``piece_bytes``, each rendered only when asked for. A client
    that reads slowly, or never, pins one piece and what its socket buffers hold, never
    the whole scrape (before: 60 clients that never read kept 1.3 GiB alive)."""
    chunks = iter_chunks(registry, histograms, accept, piece_bytes)
    if compress:
        packer = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS)  # gzip framing
        chunks = _then(map(packer.compress, chunks), packer.flush)
    # The first piece (prometheus_client's families) may be larger; it is made at once.
    yield from filter(None, chunks)  # an empty piece would end a chunked response


def _then(chunks: Iterator[bytes], last: Callable[[], bytes]) -> Iterator[bytes]:
    yield from chunks
    yield last()


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


def _help(text: str, openmetrics: bool) -> str:
    """HELP text escaped as each format asks: OpenMetrics also escapes ``"``."""
    escaped = text.replace("\\", "\\\\").replace("\n", "\\n")
    return escaped.replace('"', '\\"') if openmetrics else escaped


def render_histograms(families: Iterable[HistogramFamily], *, openmetrics: bool) -> str:
    """Prometheus text (0.0.4) or OpenMetrics lines, exemplars in OpenMetrics only."""
    return "".join(_histogram_pieces(families, openmetrics))


def _histogram_pieces(families: Iterable[HistogramFamily], openmetrics: bool) -> Iterator[str]:
    """Each family's header, then one string per series."""
    for family in families:
        name = family.name
        yield f"# HELP {name} {_help(family.documentation, openmetrics)}\n# TYPE {name} histogram\n"
        if openmetrics and unit_of(name):
            yield f"# UNIT {name} {unit_of(name)}\n"
        bounds = [repr(b) for b in family.bounds] + ["+Inf"]
        names = family.label_names
        for labels, series in family.items():
            text = ",".join(
                f'{n}="{_escape(v)}"'
                for n, v in zip(names, labels, strict=True)
                if v or n not in OMIT_EMPTY
            )
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
