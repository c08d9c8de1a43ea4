"""What an adapter does to the base's weights, ΔW per layer at a strength, whatever it came in: a LoRA/LoCon
file in any layout the family reads (ΔW = strength · scale · B·A), a DoRA/LoHa/LoKr file (peft's own layer
math, variants.py), or a run's checkpoint folder (its adapter_<component>.safetensors with the run's
network settings). `open_updates` checks that everything fits the base before anything changes."""
from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import ConfigError
from . import linalg, variants
from .files import Key, LoraFile, read_lora, read_safetensors


@dataclass
class Updates:
    path: Path
    kind: str      # LoRA, DoRA, LoHa, LoKr (from the file's header or the run's config)
    keys: list[Key]   # the layers it changes
    at: Callable[[float], Iterator[tuple[Key, torch.Tensor]]]   # strength -> (key, ΔW) per layer, fp32
    lora: LoraFile | None = None   # a LoRA/LoCon file's factors (None for the variants)

    @property
    def layers(self) -> int:
        return len(self.keys)


def open_updates(model, path: Path) -> Updates:
    """A LoRA file, a DoRA/LoHa/LoKr file or a checkpoint folder (checkpoints/step-…) on `model`, checked."""
    path = Path(path)
    if path.is_dir():
        state, metadata = checkpoint_state(path)
    else:
        state, metadata = read_safetensors(path)
    if variants.is_variant_file(metadata):
        keys = variants.check(model, path, state, metadata)
        kinds = sorted({variants.variant_name(c) for c in variants.configs_of(metadata).values()})
        return Updates(path, "/".join(kinds), keys,
                       lambda strength: variants.deltas(model, path, state, metadata, strength))
    lora = read_lora(model, path)
    return Updates(path, "LoRA", list(lora.modules),
                   lambda strength: ((key, linalg.delta(a, b, scale * strength))
                                     for key, (a, b, scale) in lora.modules.items()), lora)


def checkpoint_state(folder: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """A checkpoint's adapter weights as a peft-layout file would hold them: `<component>.<peft key>` and the
    run's peft configs (methods.lora.adapter_config over the run's config.toml), targeting exactly the
    modules the weights name."""
    from safetensors.torch import load_file
    from ..config import load_config
    from ..methods.lora import adapter_config
    from ..methods.variants import METADATA_KEY, _jsonable_config
    from ..run.contract import CONFIG_FILE, MANIFEST_FILE
    run_dir = folder.parent.parent
    files = sorted(folder.glob("adapter_*.safetensors"))
    if not (folder / MANIFEST_FILE).is_file() or not files:
        raise ConfigError(f"{folder}: not a complete adapter checkpoint (no {MANIFEST_FILE} or adapter_*.safetensors)")
    if not (run_dir / CONFIG_FILE).is_file():
        raise ConfigError(f"{folder}: no {CONFIG_FILE} in its run folder {run_dir}")
    cfg = load_config(str(run_dir / CONFIG_FILE))
    state, packed = {}, {}
    for f in files:
        component = f.stem.removeprefix("adapter_")
        weights = load_file(str(f))
        state.update({f"{component}.{k}": v for k, v in weights.items()})
        config = adapter_config(cfg, component)
        config.target_modules = sorted({variants.module_of(k) for k in weights})
        config.exclude_modules = None
        packed.update({f"{component}.{k}": v for k, v in _jsonable_config(config).items()})
    return state, {METADATA_KEY: json.dumps(packed)}
