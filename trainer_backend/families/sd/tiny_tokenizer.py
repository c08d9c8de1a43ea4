"""An offline, byte-level CLIP BPE vocabulary for the builtin tiny models.

The real CLIP vocabulary (49408 tokens) cannot be downloaded here, so the tiny models carry
their own: every byte as a character token and as an end-of-word token (so any caption in
any language tokenizes), plus merges for common English words so ordinary captions become
a sensible number of tokens. Layout and specials follow OpenAI CLIP, so `CLIPTokenizer`
loads it unchanged.
"""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

BOS, EOS = "<|startoftext|>", "<|endoftext|>"
MODEL_MAX_LENGTH = 77

# Words that caption datasets use a lot; each contributes the merges that spell it.
COMMON_WORDS = """
a an the of in on at to with and or for from by is are was be as it its this that these those
photo photograph picture image painting drawing illustration render portrait closeup close up
view shot style art artwork digital oil watercolor sketch anime cartoon realistic detailed high
quality best masterpiece background foreground light lighting dark bright shadow color colors
red green blue yellow orange purple pink black white gray grey brown gold silver
man woman person people girl boy child baby face hair eyes smile hand hands body dress shirt
dog cat bird horse animal flower flowers tree trees forest grass sky cloud clouds sun moon star
water sea ocean river lake beach mountain mountains snow rain city street road building house
room table chair window door car bike boat train plane food fruit apple book
standing sitting walking running looking holding wearing lying next near front behind over
under small large big little old young new long short beautiful cute happy sad
one two three sks token concept
""".split()


@lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2/CLIP's reversible byte -> printable character table (what ByteLevel uses)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) \
        + list(range(ord("®"), ord("ÿ") + 1))
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(printable, (chr(c) for c in chars)))


def _word_merges(word: str) -> list[tuple[str, str]]:
    """Left-to-right merges that build `word</w>` from its characters."""
    byte_chars = bytes_to_unicode()
    symbols = [byte_chars[b] for b in word.encode("utf-8")]
    symbols[-1] += "</w>"
    merges, current = [], symbols[0]
    for nxt in symbols[1:]:
        merges.append((current, nxt))
        current += nxt
    return merges


def build_vocab_and_merges() -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Deterministic vocabulary: bytes, bytes+</w>, merged words, then BOS and EOS last."""
    base = list(bytes_to_unicode().values())
    tokens = base + [c + "</w>" for c in base]
    merges: list[tuple[str, str]] = []
    known = set(tokens)
    for word in COMMON_WORDS:
        for left, right in _word_merges(word):
            merged = left + right
            if merged not in known:  # never a bare "</w>": both sides are non-empty symbols
                merges.append((left, right))
                tokens.append(merged)
                known.add(merged)
    tokens += [BOS, EOS]
    return {tok: i for i, tok in enumerate(tokens)}, merges


def write_tokenizer(out_dir: str | Path, pad_token: str = EOS) -> Path:
    """Write vocab.json, merges.txt and tokenizer_config.json that `CLIPTokenizer` loads.

    pad_token: SD1 (and SDXL's first tokenizer) pad with EOS; SD2 and SDXL's second pad with "!".
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    vocab, merges = build_vocab_and_merges()
    (out / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    lines = ["#version: 0.2"] + [f"{a} {b}" for a, b in merges]
    (out / "merges.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    config = {"tokenizer_class": "CLIPTokenizer", "model_max_length": MODEL_MAX_LENGTH,
              "bos_token": BOS, "eos_token": EOS, "unk_token": EOS, "pad_token": pad_token,
              "do_lower_case": True, "clean_up_tokenization_spaces": False}
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    return out


def vocab_size() -> int:
    return len(build_vocab_and_merges()[0])
