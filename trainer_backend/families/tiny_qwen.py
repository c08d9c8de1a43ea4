"""An offline Qwen-style byte-level BPE tokenizer and tiny Qwen3 text-model configs.

The real Qwen vocabularies (~151k tokens) cannot be downloaded here, so the tiny Z-Image,
Qwen-Image and Flux.2 models carry their own: every byte as a token (any text in any language
tokenizes, as with Qwen's byte-level BPE), merges for common caption words (no end-of-word
marker: Qwen's BPE has none; a leading space is part of the word, "Ġcat"), then Qwen's added
tokens in Qwen's order (<|endoftext|>, <|im_start|>, <|im_end|>, the vision and tool tokens,
<think> and </think>), and a chat template that renders messages as Qwen3's template does:
``<|im_start|>user\\n…<|im_end|>\\n<|im_start|>assistant\\n`` (plus an empty think block when
``enable_thinking=False``).

Public API (other families import these; keep the names):
- ``build_qwen_tokenizer(folder, model_max_length=...) -> Path``: writes vocab.json, merges.txt,
  tokenizer_config.json and tokenizer.json; ``Qwen2Tokenizer.from_pretrained(folder)`` (and
  ``AutoTokenizer``) load it offline.
- ``byte_level_vocab_and_merges()``: the byte-level BPE vocabulary and merges (without the added
  tokens), which the tiny Mistral tokenizer of Flux.2 dev (families/flux2/tiny_mistral.py) shares.
- ``qwen_vocab_size()``: the number of ids, added tokens included (a text model's vocab_size).
- ``special_token_id(name)``: the id of an added token, e.g. ``"<|im_end|>"``.
- ``tiny_qwen3_config(...) -> Qwen3Config``: a few-layer Qwen3 text model sized for tests.
"""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from .sd.tiny_tokenizer import COMMON_WORDS, bytes_to_unicode

ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"

# Qwen2/2.5/3's added tokens, in their order (Qwen's ids 151643…); the ones marked False are
# ordinary (not special) added tokens, as in Qwen3's tokenizer_config.json.
ADDED_TOKENS: list[tuple[str, bool]] = [
    (ENDOFTEXT, True), (IM_START, True), (IM_END, True),
    ("<|object_ref_start|>", True), ("<|object_ref_end|>", True), ("<|box_start|>", True),
    ("<|box_end|>", True), ("<|quad_start|>", True), ("<|quad_end|>", True),
    ("<|vision_start|>", True), ("<|vision_end|>", True), ("<|vision_pad|>", True),
    ("<|image_pad|>", True), ("<|video_pad|>", True),
    ("<tool_call>", False), ("</tool_call>", False),
    ("<|fim_prefix|>", False), ("<|fim_middle|>", False), ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False), ("<|repo_name|>", False), ("<|file_sep|>", False),
    ("<tool_response>", False), ("</tool_response>", False), ("<think>", False), ("</think>", False),
]

# Renders what Qwen3's own template renders for plain text messages (system/user/assistant).
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}"
    "{{- '<think>\\n\\n</think>\\n\\n' -}}"
    "{%- endif -%}"
    "{%- endif -%}"
)

# Words of chat prompts and of the pipelines' system prompts, besides the caption words.
_PROMPT_WORDS = """user assistant system describe the image by detailing color shape size texture quantity
text spatial relationships objects background you are helpful given instruction""".split()


def _symbols(text: str) -> list[str]:
    table = bytes_to_unicode()
    return [table[b] for b in text.encode("utf-8")]


@lru_cache(maxsize=1)
def byte_level_vocab_and_merges() -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Bytes, then left-to-right merges spelling each word after a space ("Ġcat", one token in a
    caption), then the bare words (a text's first word)."""
    tokens = list(bytes_to_unicode().values())
    known = set(tokens)
    merges: list[tuple[str, str]] = []
    words = list(dict.fromkeys(COMMON_WORDS + _PROMPT_WORDS))
    for spelled in [" " + w for w in words] + words:
        symbols = _symbols(spelled)
        current = symbols[0]
        for nxt in symbols[1:]:
            merged = current + nxt
            if merged not in known:
                merges.append((current, nxt))
                tokens.append(merged)
                known.add(merged)
            current = merged
    return {tok: i for i, tok in enumerate(tokens)}, merges


def qwen_vocab_size() -> int:
    """Ids in use: the BPE vocabulary plus the added tokens (the text model's minimum vocab_size)."""
    return len(byte_level_vocab_and_merges()[0]) + len(ADDED_TOKENS)


def special_token_id(token: str) -> int:
    """The id of one of Qwen's added tokens in this vocabulary (they follow the BPE tokens)."""
    names = [t for t, _ in ADDED_TOKENS]
    return len(byte_level_vocab_and_merges()[0]) + names.index(token)


def build_qwen_tokenizer(folder: str | Path, model_max_length: int = 512) -> Path:
    """Write the tiny Qwen tokenizer into `folder` (created); returns the folder.

    Files: vocab.json + merges.txt (GPT-2 byte-level BPE, as Qwen ships them), tokenizer_config.json
    (Qwen2Tokenizer, the added tokens, the chat template, pad = eos = <|endoftext|>, no BOS) and
    tokenizer.json (the same tokenizer for tools that read only that file).
    """
    from transformers import Qwen2Tokenizer

    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    vocab, merges = byte_level_vocab_and_merges()
    (out / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    lines = ["#version: 0.2"] + [f"{a} {b}" for a, b in merges]
    (out / "merges.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    added = {str(special_token_id(tok)): {"content": tok, "lstrip": False, "normalized": False, "rstrip": False,
                                          "single_word": False, "special": special}
             for tok, special in ADDED_TOKENS}
    config = {"tokenizer_class": "Qwen2Tokenizer", "model_max_length": model_max_length,
              "added_tokens_decoder": added, "bos_token": None, "eos_token": ENDOFTEXT,
              "pad_token": ENDOFTEXT, "unk_token": None, "errors": "replace", "split_special_tokens": False,
              "clean_up_tokenization_spaces": False, "add_prefix_space": False,
              "additional_special_tokens": [tok for tok, special in ADDED_TOKENS if special and tok != ENDOFTEXT],
              "chat_template": CHAT_TEMPLATE}
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=1, ensure_ascii=False), encoding="utf-8")
    tokenizer = Qwen2Tokenizer.from_pretrained(str(out))
    tokenizer.backend_tokenizer.save(str(out / "tokenizer.json"))
    return out


def tiny_qwen3_config(hidden_size: int = 32, num_hidden_layers: int = 2, num_attention_heads: int = 2,
                      num_key_value_heads: int = 1, intermediate_size: int | None = None,
                      head_dim: int | None = None, vocab_size: int | None = None, **extra):
    """A tiny Qwen3 text-model config whose vocabulary covers `build_qwen_tokenizer`'s ids.

    Grouped-query attention and qk-norm as in the real Qwen3 (head_dim defaults to
    hidden_size / heads); `extra` passes any other Qwen3Config field.
    """
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=vocab_size or qwen_vocab_size(), hidden_size=hidden_size,
        intermediate_size=intermediate_size or 2 * hidden_size, num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads, num_key_value_heads=num_key_value_heads,
        head_dim=head_dim or hidden_size // num_attention_heads, max_position_embeddings=1024,
        rms_norm_eps=1e-6, tie_word_embeddings=True, bos_token_id=None,
        eos_token_id=special_token_id(IM_END), pad_token_id=special_token_id(ENDOFTEXT), **extra)
