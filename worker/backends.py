"""Choose the compute backend for ``--device`` and build the synthetic models on it.

``auto`` takes PyTorch on CUDA when torch is installed and sees a GPU, NumPy on the
CPU otherwise; ``cuda`` insists on the GPU; ``cpu`` always uses NumPy. torch is an
optional extra (``pip install gpuscope[torch]``) and is imported only here, lazily.
"""

from __future__ import annotations

import importlib.util
import logging
import sys
from dataclasses import dataclass

from gpuscope.worker.config import ConfigError, WorkerConfig
from gpuscope.worker.model_api import EmbeddingModel, Generator
from gpuscope.worker.numpy_models import NumpyEmbeddingMLP, NumpyTokenGenerator

logger = logging.getLogger("gpuscope.worker")


@dataclass(frozen=True)
class Backend:
    name: str  # "numpy" or "torch-cuda"
    embedding: EmbeddingModel
    generator: Generator
    gpu_uuid: str | None


def cuda_available() -> bool:
    """torch is importable and sees at least one CUDA device."""
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return bool(torch.cuda.is_available())


def numpy_models(config: WorkerConfig) -> tuple[NumpyEmbeddingMLP, NumpyTokenGenerator]:
    embedding = NumpyEmbeddingMLP(
        hidden_size=config.hidden_size,
        layers=config.layers,
        vocab_size=config.vocab_size,
        seed=config.seed,
    )
    generator = NumpyTokenGenerator(
        hidden_size=config.hidden_size,
        layers=config.layers,
        vocab_size=config.vocab_size,
        max_context=config.max_context,
        seed=config.seed,
        kv_blocks=config.kv_cache_blocks,
        kv_block_size=config.kv_block_size,
    )
    return embedding, generator


def limit_cpu_threads(threads: int) -> None:
    """Cap the threads of NumPy's BLAS (and torch's CPU pool, when loaded) at ``threads``.

    The CPU backend computes on one device thread while the event loop serves HTTP; a
    BLAS that starts one thread per core makes them wait for each other. On two shared
    cores that cost the demo a factor of five in throughput (docs/tuning.md).
    """
    if threads <= 0:
        return
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=threads)  # process-wide until the process ends
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(threads)


def load_backend(config: WorkerConfig) -> Backend:
    """The models for ``config.device``; ``ConfigError`` names ``--device`` if it cannot be."""
    use_cuda = config.device == "cuda" or (config.device == "auto" and cuda_available())
    embedding, generator = numpy_models(config)
    if not use_cuda:
        limit_cpu_threads(config.cpu_threads)
        return Backend("numpy", embedding, generator, config.gpu_uuid)
    if not cuda_available():
        raise ConfigError("--device cuda: torch is not installed or sees no CUDA device")
    import torch

    from gpuscope.worker import torch_models

    device = torch.device("cuda", torch.cuda.current_device())
    uuid = torch_models.gpu_uuid(device)
    if uuid is None:
        logger.warning("could not read the GPU's UUID; spans will lack gpuscope.gpu.uuid")
    elif config.gpu_uuid is not None and config.gpu_uuid != uuid:
        logger.warning("--gpu-uuid %s ignored: running on %s", config.gpu_uuid, uuid)
    return Backend(
        "torch-cuda",
        torch_models.TorchEmbeddingMLP(embedding, device),
        torch_models.TorchTokenGenerator(generator, device),
        uuid,
    )
