"""Qwen-Image, Qwen-Image-Edit and Qwen-Image-Edit-2509/2511 (families/base.py's contract); heavy imports happen on first use."""
from __future__ import annotations


def __getattr__(name: str):
    if name in ("QWEN_IMAGE", "QWEN_IMAGE_EDIT", "QwenImageFamily", "QwenImageEditFamily"):
        from . import family
        return getattr(family, name)
    if name in ("QWEN_IMAGE_EDIT_PLUS", "QwenImageEditPlusFamily"):
        from . import edit_plus
        return getattr(edit_plus, name)
    raise AttributeError(name)
