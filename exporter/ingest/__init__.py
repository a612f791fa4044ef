"""What happens to an export request once its body has arrived.

``otlp_counts`` counts spans and attributes before anything expensive, ``otlp``
decodes OTLP/HTTP (protobuf or JSON) and encodes the answers, ``pipeline`` runs both
and the aggregation in the ingest thread, ``aggregator`` turns spans into the request
histograms and counters (``series`` holds them, with a cap on label sets),
``stock_spans`` counts SERVER spans of other instrumentation, and ``forward`` passes
accepted requests on to a tracing backend. Nothing here knows about sockets or GPUs.
"""
