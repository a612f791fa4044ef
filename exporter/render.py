"""Fast text rendering of the request histograms for ``/metrics``.

prometheus_client's writers cost about 10 µs per sample line; 2,000 label sets of a
20-bucket histogram would hold the event loop for almost half a second. Here each
series' label text is built once per scrape and every line is one f-string. The
output is the same exposition as ``ExporterCollector`` yields through
prometheus_client (a test parses both and compares them sample by sample); the
other families (GPU, self metrics, tokens) still go through prometheus_client.

The ``/metrics`` handler calls this in a worker thread while the event loop goes on
ingesting; ``HistogramSeries.read`` gives it a consistent copy of each series.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.exposition import choose_encoder
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
    output = encoder(registry)
    fast = render_histograms(histograms, openmetrics=openmetrics).encode()
    if openmetrics:  # one "# EOF" at the very end
        return output.removesuffix(OPENMETRICS_EOF) + fast + OPENMETRICS_EOF, content_type
    return output + fast, content_type


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
        bounds = [repr(b) for b in family.bounds] + ["+Inf"]
        names = family.label_names
        for labels, series in family.items():
            text = ",".join(f'{n}="{_escape(v)}"' for n, v in zip(names, labels, strict=True))
            prefix = f"{name}_bucket{{{text},le=" if text else f"{name}_bucket{{le="
            counts, total, spans, values = series.read()
            cumulative = 0
            for bound, count, span, value in zip(bounds, counts, spans, values, strict=True):
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
            out.append(f"{name}_count{braces} {cumulative}\n{name}_sum{braces} {total!r}\n")
    return "".join(out)
