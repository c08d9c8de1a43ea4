"""Tokenizers for single-file checkpoints, which carry weights but no tokenizer.

All SD families use the same 49408-token CLIP BPE vocabulary; they differ only in the
padding token (SD1 and SDXL's first tokenizer pad with <|endoftext|>, SD2 and SDXL's second
with "!"). So one CLIP tokenizer folder serves every arch, with the padding set per slot.
Sources, in order: `model.tokenizer` (a tokenizer folder or a diffusers model folder), the
config folder embedded in our own exports, then the Hugging Face cache (offline lookup only).
"""
from __future__ import annotations

import os
from pathlib import Path

from ...errors import ConfigError

EOS = "<|endoftext|>"
PAD_TOKENS = {"sd1": [EOS], "sd2": ["!"], "sdxl": [EOS, "!"]}
# (repo, subfolder) candidates looked up in the local Hugging Face cache only, per tokenizer slot.
HF_CACHE_CANDIDATES = {
    "sd1": [[("stable-diffusion-v1-5/stable-diffusion-v1-5", "tokenizer"),
             ("runwayml/stable-diffusion-v1-5", "tokenizer"), ("openai/clip-vit-large-patch14", "")]],
    "sd2": [[("stabilityai/stable-diffusion-2-1", "tokenizer"), ("stabilityai/stable-diffusion-2", "tokenizer"),
             ("openai/clip-vit-large-patch14", "")]],
    "sdxl": [[("stabilityai/stable-diffusion-xl-base-1.0", "tokenizer"), ("openai/clip-vit-large-patch14", "")],
             [("stabilityai/stable-diffusion-xl-base-1.0", "tokenizer_2"),
              ("laion/CLIP-ViT-bigG-14-laion2B-39B-b160k", ""), ("openai/clip-vit-large-patch14", "")]],
}
TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "tokenizer_config.json")


def _is_tokenizer_dir(p: Path) -> bool:
    return p.is_dir() and any((p / f).is_file() for f in TOKENIZER_FILES[:2])


def _with_pad(tokenizer, pad: str):
    if tokenizer.pad_token != pad:
        tokenizer.pad_token = pad
    return tokenizer


def _from_folder(folder: Path, slot: int):
    """Slot 0 -> tokenizer/, slot 1 -> tokenizer_2/ (falling back to tokenizer/), or the folder itself."""
    from transformers import CLIPTokenizer
    names = ["tokenizer"] if slot == 0 else ["tokenizer_2", "tokenizer"]
    for candidate in [folder / name for name in names] + [folder]:
        if _is_tokenizer_dir(candidate):
            tok = CLIPTokenizer.from_pretrained(str(candidate))
            if len(tok) > 3:  # not the placeholder built when no vocabulary was actually read
                return tok
    return None


def _from_hf_cache(arch: str, slot: int):
    """Only files already in the local cache: transformers 5 quietly builds an empty 3-token
    tokenizer when asked for a repo it cannot find offline, so look the files up first."""
    from huggingface_hub import try_to_load_from_cache
    cache_dir = os.environ.get("HF_HUB_CACHE") or (
        os.path.join(os.environ["HF_HOME"], "hub") if os.environ.get("HF_HOME") else None)  # read now, not at import
    for repo, sub in HF_CACHE_CANDIDATES[arch][slot]:
        for name in ("vocab.json", "tokenizer.json"):
            found = try_to_load_from_cache(repo, f"{sub}/{name}" if sub else name, cache_dir=cache_dir)
            if isinstance(found, str):
                tok = _from_folder(Path(found).parent, 0)
                if tok is not None:
                    return tok
    return None


def find_tokenizers(arch: str, tokenizer_path: str = "", config_dir: Path | None = None) -> list:
    """One CLIPTokenizer per text encoder of `arch`, padded the way that family was trained."""
    if tokenizer_path:
        folder = Path(tokenizer_path).expanduser()
        if not folder.is_dir():
            raise ConfigError(f"model.tokenizer: {folder} is not a folder")
    out = []
    for slot, pad in enumerate(PAD_TOKENS[arch]):
        tok = None
        if tokenizer_path:
            tok = _from_folder(Path(tokenizer_path).expanduser(), slot)
            if tok is None:
                raise ConfigError(f"model.tokenizer: {tokenizer_path} holds no CLIP tokenizer "
                                  "(vocab.json + merges.txt or tokenizer.json, here or in tokenizer/)")
        if tok is None and config_dir is not None:
            tok = _from_folder(config_dir, slot)
        if tok is None:
            tok = _from_hf_cache(arch, slot)
        if tok is None:
            raise ConfigError("model.tokenizer: this single-file checkpoint has no tokenizer and none is in the "
                              "Hugging Face cache; set model.tokenizer to a CLIP tokenizer folder or a diffusers "
                              "model folder of the same family (see docs/models.md)")
        out.append(_with_pad(tok, pad))
    return out
