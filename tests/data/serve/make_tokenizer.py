"""Regenerates the test tokenizer of tests/serve: ``tokenizer.json`` and ``tokenizer_config.json``.

A byte-level BPE (the GPT-2/Qwen family's pre-tokenizer and decoder) trained with the
``tokenizers`` trainer on this repository's own Markdown docs, 2,000 ids, with ChatML's special
tokens ``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>`` and six non-special added tokens,
``<tool_call>``, ``</tool_call>``, ``<tool_response>``, ``</tool_response>``, ``<think>``,
``</think>`` (as Qwen3's tokenizer has them). ``tokenizer_config.json``
carries ``chatml_tools.jinja`` (written for these tests) as its ``chat_template``, and the
special tokens transformers reads. Nothing is downloaded.

Run from the repository root: ``.venv/bin/python tests/data/serve/make_tokenizer.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
ADDED = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"]
VOCAB_SIZE = 2000


def main() -> None:
    corpus = [p.read_text(encoding="utf-8") for p in sorted((ROOT / "docs").glob("*.md"))]
    corpus.append((ROOT / "README.md").read_text(encoding="utf-8"))
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ADDED])
    tok.save(str(HERE / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 32768,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "add_bos_token": False,
        "chat_template": (HERE / "chatml_tools.jinja").read_text(encoding="utf-8"),
    }
    (HERE / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
