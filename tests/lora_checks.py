"""Helpers the LoRA-layout tests share: a stand-in for a loaded model where a family's exporter
needs only its family and denoiser, and the modules peft adapted."""
from __future__ import annotations

from types import SimpleNamespace


def model_of(family, denoiser):
    return SimpleNamespace(family=family, denoiser=denoiser)


def adapted_modules(denoiser) -> set[str]:
    return {n for n, m in denoiser.named_modules() if hasattr(m, "lora_A") and "default" in m.lora_A}
