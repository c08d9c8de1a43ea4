"""Chroma (Chroma1-HD, Chroma1-Base): a Flux.1 variant (families/base.py's contract); heavy imports
happen on first use."""
from __future__ import annotations


def __getattr__(name: str):
    if name in ("CHROMA", "ChromaFamily"):
        from . import family
        return getattr(family, name)
    raise AttributeError(name)
