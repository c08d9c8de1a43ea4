"""Which files of a hub repo a model needs (pure): the default behind `Family.hub_files`.

A diffusers repo holds more than a load reads: the same weights as fp32 and fp16 (`.fp16.safetensors`),
as safetensors and as pickles (`.bin`, `.ckpt`), Flax/ONNX copies, and often a single-file checkpoint
beside the folders. The loaders here read the full-precision safetensors of each component listed in
model_index.json, so only those (and each component's small files) are fetched.
"""
from __future__ import annotations

import re
from pathlib import PurePosixPath

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".ckpt", ".pt", ".pth", ".msgpack", ".h5", ".onnx", ".onnx_data",
                   ".pb", ".gguf", ".sft", ".tflite", ".ot")
# never needed to load: pictures, docs, repo metadata
SKIPPED_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".gif", ".md", ".gitattributes", ".mp4", ".pdf")
FORMAT_PREFERENCE = (".safetensors", ".bin")   # the loaders read these, safetensors first
_SHARD = re.compile(r"-\d{5}-of-\d{5}")
_VARIANT = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")   # fp16, bf16, non_ema; not the "0" of "base_1.0"
_INDEX = re.compile(r"\.index(\.[A-Za-z0-9_]+)?\.json$")


def _weight_group(name: str) -> tuple[str, str] | None:
    """(variant, format) of a weight file or of a shard index: `unet/x.fp16.safetensors` -> ("fp16",
    ".safetensors"); `x-00001-of-00002.safetensors` -> ("", ".safetensors"); None for other files."""
    base = PurePosixPath(name).name
    index = _INDEX.search(base)
    if index:
        stem = base[:index.start()]
        variant = (index.group(1) or "").lstrip(".")
        fmt = ".safetensors" if stem.endswith(".safetensors") or "safetensors" in stem else ".bin"
        return variant, fmt
    suffix = next((s for s in WEIGHT_SUFFIXES if base.endswith(s)), None)
    if suffix is None:
        return None
    stem = _SHARD.sub("", base[:-len(suffix)])
    variant = stem.rsplit(".", 1)[1] if "." in stem else ""
    return (variant if _VARIANT.match(variant) else ""), suffix


def _best_group(groups: set[tuple[str, str]]) -> tuple[str, str] | None:
    """Full precision before a variant (the loaders read no variant), safetensors before pickles;
    formats no loader here reads (Flax, ONNX, GGUF) never."""
    usable = [g for g in groups if g[1] in FORMAT_PREFERENCE]
    if not usable:
        return None
    return min(usable, key=lambda g: (g[0] != "", FORMAT_PREFERENCE.index(g[1]), g[0]))


def folder_files(files: list[str]) -> list[str]:
    """The small files, and in each folder the weights of one variant and format only."""
    groups: dict[str, set[tuple[str, str]]] = {}
    for name in files:
        group = _weight_group(name)
        if group is not None:
            groups.setdefault(str(PurePosixPath(name).parent), set()).add(group)
    chosen = {folder: _best_group(found) for folder, found in groups.items()}
    keep = []
    for name in files:
        if name.lower().endswith(SKIPPED_SUFFIXES):
            continue
        group = _weight_group(name)
        if group is None or group == chosen.get(str(PurePosixPath(name).parent)):
            keep.append(name)
    return keep


def component_names(index: dict) -> list[str]:
    """The pipeline components model_index.json lists with a class (`"vae": ["diffusers", "AutoencoderKL"]`)."""
    return [key for key, value in index.items() if not key.startswith("_") and isinstance(value, list)
            and len(value) == 2 and value[0] and value[1]]


def pipeline_files(files: list[str], index: dict) -> list[str]:
    """A diffusers pipeline repo: model_index.json and each listed component's folder (one weight
    variant and format each); no single-file checkpoint beside the folders, no other folders."""
    components = set(component_names(index))
    inside = [name for name in files if "/" in name and name.split("/", 1)[0] in components]
    return sorted({*folder_files(inside), *(["model_index.json"] if "model_index.json" in files else [])})


def plain_files(files: list[str]) -> list[str]:
    """A repo that is not a pipeline (a VAE, a tokenizer, a text encoder): every folder's small files
    and one weight variant and format per folder."""
    return sorted(folder_files(files))


def tokenizer_files(files: list[str]) -> list[str]:
    """Tokenizer (and processor) files only: no weights."""
    return sorted(n for n in files if _weight_group(n) is None and not n.lower().endswith(SKIPPED_SUFFIXES))
