"""A saved SD diffusers folder in the layout transformers-4 tools read as well.

transformers 5 writes CLIP tokenizers as `tokenizer.json` only and CLIPTextModel weights
without the `text_model.` prefix (its CLIPTextModel is flattened). kohya's sd-scripts and
older diffusers (transformers 4) then fail on the tokenizer, or load a random text encoder
with only a warning. After `save_pretrained` this adds `vocab.json` + `merges.txt` next to
`tokenizer.json` and writes text-encoder keys with the `text_model.` prefix, which
transformers 5 also loads."""
from __future__ import annotations

import json
import os
from pathlib import Path

PREFIX = "text_model."
KEEP_TOP_LEVEL = ("text_model.", "text_projection.", "logit_scale")   # CLIPTextModelWithProjection's own


def write_bpe_files(tokenizer_dir: Path) -> bool:
    """vocab.json and merges.txt (`#version: 0.2` first) from tokenizer.json's BPE model."""
    tokenizer_dir = Path(tokenizer_dir)
    source = tokenizer_dir / "tokenizer.json"
    if not source.is_file() or (tokenizer_dir / "vocab.json").is_file():
        return False
    model = json.loads(source.read_text(encoding="utf-8")).get("model") or {}
    if model.get("type") != "BPE":
        return False
    vocab = dict(sorted(model["vocab"].items(), key=lambda item: item[1]))
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    (tokenizer_dir / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    (tokenizer_dir / "merges.txt").write_text("#version: 0.2\n" + "".join(m + "\n" for m in merges),
                                               encoding="utf-8")
    return True


def prefix_text_model_keys(encoder_dir: Path) -> bool:
    """Rewrite a CLIPTextModel's weights with `text_model.`-prefixed keys (transformers 4's layout)."""
    from safetensors import safe_open
    from safetensors.torch import save_file
    changed = False
    for path in sorted(Path(encoder_dir).glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as fh:
            keys, metadata = list(fh.keys()), fh.metadata() or {}
            if all(k.startswith(KEEP_TOP_LEVEL) for k in keys):
                continue
            state = {(k if k.startswith(KEEP_TOP_LEVEL) else PREFIX + k): fh.get_tensor(k) for k in keys}
        tmp = path.with_suffix(".tmp")
        save_file(state, str(tmp), metadata={**metadata, "format": metadata.get("format", "pt")})
        os.replace(tmp, path)
        changed = True
    index = Path(encoder_dir) / "model.safetensors.index.json"
    if changed and index.is_file():
        data = json.loads(index.read_text(encoding="utf-8"))
        data["weight_map"] = {(k if k.startswith(KEEP_TOP_LEVEL) else PREFIX + k): v
                              for k, v in data.get("weight_map", {}).items()}
        index.write_text(json.dumps(data, indent=2), encoding="utf-8")
    return changed


def write_transformers4_layout(folder: Path) -> None:
    """Every tokenizer*/ and text_encoder*/ of a saved pipeline folder."""
    folder = Path(folder)
    for sub in sorted(folder.glob("tokenizer*")):
        if sub.is_dir():
            write_bpe_files(sub)
    for sub in sorted(folder.glob("text_encoder*")):
        if sub.is_dir():
            prefix_text_model_keys(sub)
