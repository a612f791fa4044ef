"""The reference inference worker: OpenAI-compatible endpoints over batching schedulers."""
