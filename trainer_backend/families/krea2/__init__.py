"""Krea 2 Raw and Turbo (families/base.py's contract); heavy imports happen on first use."""
from __future__ import annotations


def __getattr__(name: str):
    if name in ("KREA2", "Krea2Family"):
        from . import family
        return getattr(family, name)
    raise AttributeError(name)
