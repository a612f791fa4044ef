"""The torch models against the NumPy ones (same seed, same numbers); skipped without torch."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from gpuscope.worker.backends import cuda_available, load_backend, numpy_models
from support.worker_servers import SMALL

torch: Any = pytest.importorskip("torch")


def _check_matches_numpy(device: Any) -> None:
    from gpuscope.worker.torch_models import TorchEmbeddingMLP, TorchTokenGenerator

    embedding, generator = numpy_models(SMALL)
    texts = [[1, 2, 3], [40, 50]]
    on_torch = TorchEmbeddingMLP(embedding, device).embed(texts)
    np.testing.assert_allclose(on_torch, embedding.embed(texts), rtol=1e-3, atol=1e-4)
    torch_generator = TorchTokenGenerator(generator, device)
    numpy_states = [generator.start([5, 6, 7])]
    torch_states = [torch_generator.start([5, 6, 7])]
    expected = [generator.step(numpy_states)[0] for _ in range(4)]
    assert [torch_generator.step(torch_states)[0] for _ in range(4)] == expected


def test_worker_torch_cpu_models_match_numpy() -> None:
    _check_matches_numpy(torch.device("cpu"))


@pytest.mark.gpu
@pytest.mark.skipif(not cuda_available(), reason="needs a CUDA GPU")
def test_worker_cuda_backend_matches_numpy_and_reads_the_uuid() -> None:
    backend = load_backend(SMALL)
    assert backend.name == "torch-cuda"
    assert backend.gpu_uuid is not None and backend.gpu_uuid.startswith(("GPU-", "MIG-"))
    _check_matches_numpy(torch.device("cuda"))
