"""Wan 2.2 (families/base.py's contract: family.py, family_i2v.py, family_ti2v.py; their building blocks beside
them); heavy imports on first use."""
from __future__ import annotations


def __getattr__(name: str):
    if name in ("WAN22_T2V", "Wan22Family"):
        from . import family
        return getattr(family, name)
    if name in ("WAN22_I2V", "Wan22I2VFamily"):
        from . import family_i2v
        return getattr(family_i2v, name)
    if name in ("WAN22_TI2V", "Wan22TI2VFamily"):
        from . import family_ti2v
        return getattr(family_ti2v, name)
    raise AttributeError(name)
