"""The torch models against the NumPy ones (same seed, same numbers); skipped without torch."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import numpy as np
import pytest

from gpuscope.worker.backends import cuda_available, load_backend, numpy_models
from gpuscope.worker.kv_cache import SequenceState
from gpuscope.worker.model_api import EmbeddingModel, Generator
from support.worker_servers import SMALL, serve_worker

torch: Any = pytest.importorskip("torch")


def _check_matches_numpy(device: Any) -> None:
    from gpuscope.worker.torch_models import TorchEmbeddingMLP, TorchTokenGenerator

    embedding, generator = numpy_models(SMALL)
    texts = [[1, 2, 3], [40, 50]]
    on_torch = TorchEmbeddingMLP(embedding, device).embed(texts)
    np.testing.assert_allclose(on_torch, embedding.embed(texts), rtol=1e-3, atol=1e-4)
    torch_generator = TorchTokenGenerator(generator, device)
    prompts = [[5, 6, 7], list(range(40, 70)), [9]]
    numpy_states: list[SequenceState] = []
    torch_states: list[SequenceState] = []
    for iteration in range(40):  # newcomers join a running batch; the caches grow
        if iteration % 5 == 0 and len(numpy_states) < len(prompts):
            numpy_states.append(generator.start(prompts[len(numpy_states)]))
            torch_states.append(torch_generator.start(prompts[len(torch_states)]))
        assert torch_generator.step(torch_states) == generator.step(numpy_states)


def test_worker_torch_cpu_models_match_numpy() -> None:
    _check_matches_numpy(torch.device("cpu"))


async def test_worker_serves_torch_cpu_models_like_numpy() -> None:
    """The torch models behind the real schedulers and HTTP (``--device`` never picks
    torch on the CPU, so they come in through ``create_app``)."""
    from gpuscope.worker.torch_models import TorchEmbeddingMLP, TorchTokenGenerator

    embedding, generator = numpy_models(SMALL)
    cpu = torch.device("cpu")
    body = {"model": SMALL.model_name, "prompt": "hello", "max_tokens": 12}
    texts = {}
    backends: dict[str, tuple[EmbeddingModel, Generator]] = {
        "numpy": (embedding, generator),
        "torch": (TorchEmbeddingMLP(embedding, cpu), TorchTokenGenerator(generator, cpu)),
    }
    for name, models in backends.items():
        with serve_worker(
            embedding_model=models[0], generator=models[1], batching="continuous"
        ) as url:
            async with httpx.AsyncClient(base_url=url, timeout=30) as client:
                answers = await asyncio.gather(
                    *(
                        client.post("/v1/completions", json=body | {"prompt": f"p{i}"})
                        for i in range(4)
                    ),
                    client.post("/v1/embeddings", json={"model": SMALL.model_name, "input": "x"}),
                )
        assert [a.status_code for a in answers] == [200] * 5
        texts[name] = [a.json()["choices"][0]["text"] for a in answers[:4]]
        vector = answers[4].json()["data"][0]["embedding"]
        np.testing.assert_allclose(vector, embedding.embed([[ord("x")]])[0], rtol=1e-3, atol=1e-4)
    assert texts["torch"] == texts["numpy"]


@pytest.mark.gpu
@pytest.mark.skipif(not cuda_available(), reason="needs a CUDA GPU")
def test_worker_cuda_backend_matches_numpy_and_reads_the_uuid() -> None:
    backend = load_backend(SMALL)
    assert backend.name == "torch-cuda"
    assert backend.gpu_uuid is not None and backend.gpu_uuid.startswith(("GPU-", "MIG-"))
    _check_matches_numpy(torch.device("cuda"))
