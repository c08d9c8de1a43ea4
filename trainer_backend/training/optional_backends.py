"""Optional back-ends (torchao, bitsandbytes) load only for a run whose options use them.

diffusers, transformers and peft import every quantization package they find installed, at their
own import, whatever the run does; on a machine without their native kernels that import alone
logs "Failed to load … _C_mxfp8", "Detected no triton", "Failed to load CPU gemm_4bit_forward
from kernels-community" into every run's log. Before those libraries are imported, the trainer
marks the packages its options do not use as absent (`sys.modules[name] = None`, Python's own
"this module is unavailable": `importlib.util.find_spec` then answers None and `import` fails
cleanly), so the libraries skip them as if they were not installed. A run that asks for one
(model.quantize = "nf4", optimizer.name = "adamw8bit", …) loads it as before, and a model folder
that was saved quantized (a `quantization_config` in its configs) blocks nothing.
"""
from __future__ import annotations

import sys
from pathlib import Path

from ..config import TrainConfig
from ..config.quantize_rules import QUANT_PACKAGES
from ..config.rules import OPTIMIZER_PACKAGES

OPTIONAL = ("torchao", "bitsandbytes")   # what the libraries import eagerly and only some options use


def needed_backends(cfg: TrainConfig) -> set[str]:
    """The optional packages this config's options use (pure)."""
    m = cfg.model
    wanted = {QUANT_PACKAGES.get(m.quantize), QUANT_PACKAGES.get(m.quantize_text_encoders),
              OPTIMIZER_PACKAGES.get(cfg.optimizer.name)}
    return {name for name in OPTIONAL if name in wanted}


def _saved_quantized(model_path: str) -> bool:
    """A diffusers/transformers folder saved with a quantization_config needs its package to load."""
    folder = Path(model_path)
    try:
        if not folder.is_dir():
            return False
        return any("quantization_config" in p.read_text(encoding="utf-8", errors="replace")
                   for p in (folder / "config.json", *folder.glob("*/config.json")) if p.is_file())
    except OSError:
        return False


def hold_back_unused(cfg: TrainConfig) -> list[str]:
    """Mark the optional packages this run does not use as unavailable, before diffusers and
    transformers are imported; returns their names. A package already imported is left alone."""
    if _saved_quantized(str(cfg.model.path)):
        return []
    held = [name for name in OPTIONAL if name not in needed_backends(cfg) and name not in sys.modules]
    for name in held:
        sys.modules[name] = None  # type: ignore[assignment]  # Python's marker for "not importable"
    return held
