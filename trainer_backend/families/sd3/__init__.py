"""Stable Diffusion 3 and 3.5 (families/base.py's contract); heavy imports happen on first use."""
from __future__ import annotations


def __getattr__(name: str):
    if name in ("SD3", "SD3Family"):
        from . import family
        return getattr(family, name)
    raise AttributeError(name)
