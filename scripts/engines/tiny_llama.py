"""Make a tiny randomly initialised Llama with a locally trained tokenizer, for vLLM on a CPU.

No model can be downloaded on the machines gpuscope is developed on, and the real-engine
checks only need an engine that schedules, queues and generates: the weights are random,
so the text is nonsense, but prefill, decode and queueing are vLLM's own. The CPU attention
needs a head size of at least 32 (hidden 128 with 4 heads). Runs in the engine's venv
(torch, transformers, tokenizers), not in gpuscope's.

    python scripts/engines/tiny_llama.py OUT_DIR
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>"]


def _corpus() -> list[str]:
    """A few hundred lines of varied text for the BPE merges; deterministic."""
    words = [
        "the",
        "gpu",
        "queue",
        "batch",
        "request",
        "token",
        "latency",
        "prefill",
        "decode",
        "model",
        "cache",
        "memory",
        "clock",
        "power",
        "server",
        "client",
        "stream",
        "answer",
        "question",
        "compute",
        "kernel",
        "tensor",
        "scheduler",
        "window",
        "wait",
        "time",
        "second",
        "millisecond",
        "throughput",
        "engine",
        "worker",
    ]
    lines = []
    for i in range(400):
        lines.append(" ".join(words[(i * 7 + j * 3) % len(words)] for j in range(12 + i % 9)))
    return lines


def make(out: Path, *, layers: int = 2, hidden: int = 128, heads: int = 4) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
    )
    fast.chat_template = CHAT_TEMPLATE
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=fast.vocab_size,
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=512,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
        torch_dtype="bfloat16",
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    fast.save_pretrained(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="folder to write the model and tokenizer to")
    args = parser.parse_args(argv)
    make(args.out)
    print(f"tiny llama written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
