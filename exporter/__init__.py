"""The gpuscope exporter: OTLP spans in, Prometheus metrics out, GPU counters beside them."""
