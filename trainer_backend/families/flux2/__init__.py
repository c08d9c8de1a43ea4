"""Flux.2 Klein (families/base.py's contract); heavy imports happen on first use."""
from __future__ import annotations


def __getattr__(name: str):
    if name in ("FLUX2", "Flux2Family"):
        from . import family
        return getattr(family, name)
    raise AttributeError(name)
