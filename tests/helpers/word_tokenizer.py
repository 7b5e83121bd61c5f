"""The stand-in vLLM's tokenizer as a Hugging Face tokenizer.json, for the clients that cut prompts with the
model's own tokenizer (llama-benchy, through the `tokenizers` library).

**A stand-in, not a model's tokenizer.** The stand-in vLLM counts one token per whitespace-separated word
(tests/standins/vllm/README.md); this file says the same to `tokenizers`: a WordLevel model over the words of a
given text, split on whitespace, decoded by joining with spaces. A prompt cut to N tokens with it is N words of the
text, which the stand-in counts as N prompt tokens, so a benchmark's token counts and rates agree with the
stand-in's known ones."""

from __future__ import annotations

import json
from pathlib import Path

UNKNOWN = "[UNK]"


def write_word_tokenizer(folder: Path, text: str) -> Path:
    """FOLDER/tokenizer.json for the words of TEXT (each distinct whitespace-separated word one id); FOLDER."""
    vocab = {UNKNOWN: 0}
    for word in text.split():
        vocab.setdefault(word, len(vocab))
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [],
        "normalizer": None,
        "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": None,
        "decoder": None,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": UNKNOWN},
    }
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer), encoding="utf-8")
    return folder
