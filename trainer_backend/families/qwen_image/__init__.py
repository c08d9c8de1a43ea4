"""Qwen-Image and Qwen-Image-Edit (families/base.py's contract); heavy imports happen on first use."""
from __future__ import annotations


def __getattr__(name: str):
    if name in ("QWEN_IMAGE", "QWEN_IMAGE_EDIT", "QwenImageFamily", "QwenImageEditFamily"):
        from . import family
        return getattr(family, name)
    raise AttributeError(name)
