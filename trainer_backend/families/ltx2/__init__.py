"""LTX-2 (families/base.py's contract: family.py; its building blocks beside it); heavy imports on first use."""
from __future__ import annotations


def __getattr__(name: str):
    if name in ("LTX2", "LTX2Family"):
        from . import family
        return getattr(family, name)
    raise AttributeError(name)
