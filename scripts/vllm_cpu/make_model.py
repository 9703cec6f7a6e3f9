"""Builds the tiny random-weight model the real CPU vLLM engines serve, without any hub.

A Qwen3 architecture (2 layers, hidden 128, 4 query / 2 KV heads of 32, bf16) with a fixed seed,
its vocabulary the repository's test tokenizer (``tests/data/serve/``: a byte-level BPE with
ChatML and tool-call tokens) rounded up to 64 ids, saved with that tokenizer beside it. Its output
is random tokens, which routing tests do not mind: they compare the router's predictions with the
engine's own ``cached_tokens`` and block events. ≈ 1 MB on disk, a few seconds (mostly torch's import).

Idempotent: ``OUT/.smetric-model`` records the digest of the tokenizer files and this script; an
unchanged pair returns at once. Runs under the vLLM venv (torch + transformers):
``.venv-vllm/bin/python scripts/vllm_cpu/make_model.py OUT``.
"""

from __future__ import annotations

import hashlib
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOKENIZER_DIR = ROOT / "tests" / "data" / "serve"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
STAMP = ".smetric-model"


def digest() -> str:
    h = hashlib.sha256()
    for path in (*(TOKENIZER_DIR / f for f in TOKENIZER_FILES), Path(__file__)):
        h.update(path.read_bytes())
    return h.hexdigest()


def build(out: Path) -> Path:
    """Writes the model to ``out`` unless it already holds this build; returns ``out``."""
    want = digest()
    stamp = out / STAMP
    if stamp.exists() and stamp.read_text() == want:
        return out
    import torch
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(TOKENIZER_DIR))
    vocab = -(-len(tokenizer) // 64) * 64
    config = Qwen3Config(
        vocab_size=vocab,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        bos_token_id=None,
        torch_dtype="bfloat16",
    )
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(config).to(torch.bfloat16)
    if out.exists():
        shutil.rmtree(out)
    model.save_pretrained(str(out))
    for name in TOKENIZER_FILES:
        shutil.copyfile(TOKENIZER_DIR / name, out / name)
    stamp.write_text(want)
    return out


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: make_model.py OUT")
    print(build(Path(sys.argv[1])))
