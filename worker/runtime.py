"""``Worker``: what serves the requests, without HTTP: the schedulers built from the
configuration on one device thread, their shared policy and limits, and ``drain()``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from opentelemetry import trace

from gpuscope.middleware import BatchRecorder
from gpuscope.worker.backends import load_backend
from gpuscope.worker.config import WorkerConfig
from gpuscope.worker.embedding import EmbeddingScheduler
from gpuscope.worker.generation import GenerationScheduler
from gpuscope.worker.model_api import ByteTokenizer, EmbeddingModel, Generator
from gpuscope.worker.protocol import Limits
from gpuscope.worker.scheduler import BatchPolicy, DeviceThread

logger = logging.getLogger("gpuscope.worker")


@dataclass
class Worker:
    """What the handlers share: configuration, schedulers and the tokenizer."""

    config: WorkerConfig
    policy: BatchPolicy
    limits: Limits
    tokenizer: ByteTokenizer
    device: DeviceThread
    embeddings: EmbeddingScheduler | None
    completions: GenerationScheduler | None
    created: int

    def schedulers(self) -> list[EmbeddingScheduler | GenerationScheduler]:
        return [s for s in (self.embeddings, self.completions) if s is not None]

    @property
    def serving(self) -> bool:
        return all(s.accepting for s in self.schedulers())

    async def drain(self) -> None:
        """Stop admitting (new requests get 503), give running ones
        ``--shutdown-timeout-s`` to finish, then fail the rest with 503."""
        await asyncio.gather(*(s.close(self.config.shutdown_timeout_s) for s in self.schedulers()))


def build_worker(
    config: WorkerConfig,
    tracer_provider: trace.TracerProvider | None,
    embedding_model: EmbeddingModel | None,
    generator: Generator | None,
) -> Worker:
    """The schedulers, on one device thread, for ``config``: the synthetic models of
    ``--device`` unless both models are given."""
    gpu_uuid = config.gpu_uuid
    if embedding_model is None or generator is None:
        backend = load_backend(config)
        embedding_model = embedding_model or backend.embedding
        generator = generator or backend.generator
        gpu_uuid = backend.gpu_uuid
        logger.info("backend %s, gpu uuid %s", backend.name, gpu_uuid)
    policy = BatchPolicy(
        mode=config.batching,
        max_batch_size=config.max_batch_size,
        max_queue_delay_s=config.max_queue_delay_ms / 1000,
        max_queue=config.max_queue,
    )

    def recorder() -> BatchRecorder:
        return BatchRecorder(
            max_size=config.max_batch_size,
            model=config.model_name,
            gpu_uuid=gpu_uuid,
            tracer_provider=tracer_provider,
        )

    device = DeviceThread()
    limits = Limits(
        model_name=config.model_name,
        vocab_size=config.vocab_size,
        max_context=min(config.max_context, generator.max_context),
        max_new_tokens=config.max_new_tokens,
        dimensions=embedding_model.dimensions,
    )
    return Worker(
        config=config,
        policy=policy,
        limits=limits,
        tokenizer=ByteTokenizer(),
        device=device,
        embeddings=EmbeddingScheduler(embedding_model, policy, recorder(), device)
        if "embeddings" in config.serve
        else None,
        completions=GenerationScheduler(generator, policy, recorder(), device)
        if "completions" in config.serve
        else None,
        created=int(time.time()),
    )
