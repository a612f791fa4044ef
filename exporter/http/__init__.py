"""The exporter's HTTP side: everything between a socket and the parts that do the work.

``server`` binds the listener (TLS, the connection cap) and runs the app until a
signal; ``app`` builds it and wires its parts into an ``ExporterState``; ``handlers``
answers ``/v1/traces``, ``/metrics``, ``/healthz`` and ``/readyz`` (``routes``
holds the OTLP path and its error answer); ``auth`` and
``security`` check credentials from the web-config file, which ``reload`` rereads
when it changes; ``connections`` counts and sheds connections; ``render`` writes the
scrape; ``threads`` is the bounded pool the password checks run in. Nothing here
decodes a span or reads a GPU.
"""
