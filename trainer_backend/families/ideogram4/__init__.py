"""Ideogram 4 (families/base.py's contract); heavy imports happen on first use."""
from __future__ import annotations


def __getattr__(name: str):
    if name in ("IDEOGRAM4", "Ideogram4Family"):
        from . import family
        return getattr(family, name)
    raise AttributeError(name)
