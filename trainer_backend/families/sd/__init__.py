"""Base models: load SD1/SD2/SDXL (folder, single file, builtin tiny), text encoding, export.

Heavy imports (torch, diffusers) happen inside the functions, so importing this package is cheap.
"""
from __future__ import annotations

from ..builtin import BUILTIN_MODELS, resolve_model_path
from .tiny import build_tiny_model, make_tiny_model

__all__ = ["SD1", "SD2", "SDXL", "BUILTIN_MODELS", "build_tiny_model", "make_tiny_model", "resolve_model_path",
           "LoadedModel", "detect_arch", "load_model", "build_pipeline", "save_single_file",
           "export_single_file", "tokenize", "encode_text", "sdxl_add_time_ids"]


def __getattr__(name: str):
    if name in ("SD1", "SD2", "SDXL", "StableDiffusionFamily"):  # the Family objects (families/registry.py)
        from . import family
        return getattr(family, name)
    # Lazy: loader/text import torch-dependent code paths only when asked for.
    if name == "LoadedModel":
        from ..base import LoadedModel
        return LoadedModel
    if name in ("detect_arch", "load_model", "build_pipeline"):
        from . import loader
        return getattr(loader, name)
    if name in ("save_single_file", "export_single_file"):
        from . import single_file_export
        return getattr(single_file_export, name)
    if name in ("tokenize", "encode_text", "sdxl_add_time_ids"):
        from . import text
        return getattr(text, name)
    raise AttributeError(name)
