"""Qwen-Image 2.1 (families/base.py's contract): generation and editing in one model; heavy imports happen on first use."""
from __future__ import annotations


def __getattr__(name: str):
    if name in ("QWEN_IMAGE_21", "QwenImage21Family"):
        from . import family
        return getattr(family, name)
    raise AttributeError(name)
