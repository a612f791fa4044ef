"""Load generation, latency reports and the demo."""
