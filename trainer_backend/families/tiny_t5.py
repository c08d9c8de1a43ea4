"""An offline T5-style (SentencePiece unigram) tokenizer for the tiny flow-matching models.

The real T5-XXL vocabulary cannot be downloaded here. This one has T5's specials (<pad> 0,
</s> 1, <unk> 2), a "▁word" piece for common caption words and every printable ASCII character
with and without the word-start mark; other characters become <unk>, as in T5 itself.
`T5Tokenizer.from_pretrained(folder)` loads it unchanged.
"""
from __future__ import annotations

import json
from pathlib import Path

from .sd.tiny_tokenizer import COMMON_WORDS

SPECIALS = ["<pad>", "</s>", "<unk>"]


def t5_vocab() -> list[tuple[str, float]]:
    pieces: list[tuple[str, float]] = [(s, 0.0) for s in SPECIALS]
    seen = {p for p, _ in pieces}
    for word in COMMON_WORDS:
        if "▁" + word not in seen:
            pieces.append(("▁" + word, -5.0))
            seen.add("▁" + word)
    for code in range(33, 127):
        for piece in (chr(code), "▁" + chr(code)):
            if piece not in seen:
                pieces.append((piece, -10.0))
                seen.add(piece)
    pieces.append(("▁", -8.0))
    return pieces


def t5_vocab_size() -> int:
    return len(t5_vocab())


def write_t5_tokenizer(folder: str | Path, model_max_length: int = 512) -> Path:
    """tokenizer.json + tokenizer_config.json of the tiny T5 tokenizer."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.Unigram(t5_vocab(), unk_id=2))
    tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Replace(r"\s+", " ")])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", pair="$A </s> $B </s>",
                                                       special_tokens=[("</s>", 1)])
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "T5Tokenizer", "eos_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>",
        "extra_ids": 0, "additional_special_tokens": [], "model_max_length": model_max_length}, indent=1))
    return folder
