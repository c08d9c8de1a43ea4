"""LoRA tools after a run: merge into the base, mix, resize, extract from a fine-tune, post-hoc EMA over a
run's checkpoints, inspect. `python -m trainer_backend lora …` (cli.py); docs/lora-tools.md."""
from __future__ import annotations

__all__ = ["extract", "inspect", "merge", "mix", "post_hoc_ema", "resize"]


def __getattr__(name: str):
    if name == "inspect":
        from .inspect_file import inspect
        return inspect
    if name in __all__:
        from . import tools
        return getattr(tools, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
