"""The exporter's HTTP side: everything between a socket and the parts that do the work.

Transport only: the parts (aggregator, ingest, GPU poller, forwarder) are built and
wired by the composition root, ``gpuscope.exporter.app``, and run by
``gpuscope.exporter.service``; nothing here imports either, and neither ``ingest``
nor ``state`` imports anything here. ``server`` binds the listener (TLS, the
connection cap) and stops it in order; ``app`` puts the routes and middlewares around
an ``ExporterState``; ``handlers`` answers ``/v1/traces``, ``/metrics``, ``/healthz``
and ``/readyz`` (``routes`` holds the OTLP path and its error answer); ``auth`` and
``security`` check credentials from the web-config file, which ``reload`` rereads
when it changes; ``connections`` counts and sheds connections; ``render`` writes the
scrape. Nothing here decodes a span or reads a GPU.
"""
