"""The model plug-in interface: the token ids a model takes and returns, and the
``EmbeddingModel`` and ``Generator`` protocols the schedulers drive.

Plug in your own model by implementing ``EmbeddingModel`` or ``Generator``; the
schedulers call them from one dedicated device thread, never concurrently. The
synthetic models that ship with the worker are in ``numpy_models`` and
``torch_models``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from gpuscope.worker.kv_cache import BlockPool, SequenceState

FloatArray = npt.NDArray[np.float32]

# Token ids: 0..255 are bytes, then the specials.
BOS_TOKEN = 256
EOS_TOKEN = 257
# Generated ids decode to these characters (after the bytes, ids map round-robin).
_ALPHABET = "abcdefghijklmnopqrstuvwxyz     ,.etaoinshr"


@runtime_checkable
class EmbeddingModel(Protocol):
    """One forward pass per batch: token sequences in, one vector per sequence out."""

    @property
    def dimensions(self) -> int: ...

    def embed(self, batch: Sequence[Sequence[int]]) -> FloatArray:
        """Return ``[len(batch), dimensions]`` float32, on the host (synchronised)."""
        ...


@runtime_checkable
class Generator(Protocol):
    """A token generator stepped one iteration at a time over a changing set of sequences,
    its keys and values in a paged cache of ``kv_pool``'s blocks.

    The scheduler reserves each sequence's blocks from ``kv_pool`` before a step and
    releases them when the sequence leaves or is preempted; ``step`` writes and reads
    the cache through each sequence's block table.
    """

    @property
    def max_context(self) -> int: ...

    @property
    def kv_pool(self) -> BlockPool: ...

    def start(self, prompt: Sequence[int]) -> SequenceState:
        """The state of a new sequence (``ValueError`` for a prompt it cannot take);
        no blocks and no compute yet."""
        ...

    def step(self, sequences: Sequence[SequenceState]) -> list[int]:
        """One iteration: prefill what each sequence's cache lacks (its prompt, or all
        its tokens after a preemption), decode one token for the others.

        Returns the next token of every sequence, on the host (synchronised).
        """
        ...


class ByteTokenizer:
    """Text to token ids (UTF-8 bytes) and generated ids back to text."""

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode_token(self, token: int) -> str:
        if token < 128:
            return chr(token) if 32 <= token < 127 else " "
        return _ALPHABET[token % len(_ALPHABET)]
