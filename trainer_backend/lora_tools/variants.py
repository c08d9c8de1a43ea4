"""DoRA, LoHa and LoKr files (the peft layout the trainer writes for them, methods/variants.py: weights as
`<component>.<peft key>`, the peft configs in the `lora_adapter_metadata` header) in the LoRA tools.

Their update of a layer is not one low-rank product B·A: LoHa is (B₁A₁)⊙(B₂A₂), LoKr a Kronecker product,
DoRA rescales each output row of W + ΔW to a learned magnitude. So the tools take ΔW from peft's own layer
math: the adapter is put on the base (`inject_adapter_in_model` + `set_peft_model_state_dict`, as diffusers
and `methods.variants.load_adapter_file` load it), each layer merged by peft (`layer.merge`, at the strength
via `scale_layer`), ΔW = merged − base read off, the base weight put back, and the adapter layers removed.
"""
from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from pathlib import Path

import torch

from ..errors import ConfigError
from .files import Key, components, configs_of, variant_name  # noqa: F401 (re-exported)

ADAPTER = "lora_tools"   # the adapter's name while it sits on the base


def module_of(peft_key: str) -> str:
    """'down_blocks.0….to_q.lora_magnitude_vector' -> 'down_blocks.0….to_q' (lora_*, hada_*, lokr_* keys)."""
    return re.split(r"\.(?:lora_|hada_|lokr_)", peft_key, maxsplit=1)[0]


def is_variant_file(metadata: dict) -> bool:
    from ..methods.variants import METADATA_KEY
    return METADATA_KEY in metadata


def summary(path: Path, state: dict[str, torch.Tensor], metadata: dict) -> dict:
    """What `inspect` shows of such a file: per component the variant, rank, alpha, modules, targets."""
    out = {}
    for component, config in configs_of(metadata).items():
        prefix = component + "."
        keys = [k[len(prefix):] for k in state if k.startswith(prefix)]
        modules = {module_of(k) for k in keys}
        out[component] = {"variant": variant_name(config), "rank": config.get("r"), "alpha": config.get("alpha",
                          config.get("lora_alpha")), "modules": len(modules), "tensors": len(keys),
                          "target_modules": config.get("target_modules"),
                          "rank_pattern": config.get("rank_pattern") or {}}
    if not out:
        raise ConfigError(f"{path}: a peft-layout file without adapter configs in its header")
    return out


@contextlib.contextmanager
def on_base(model, path: Path, state: dict[str, torch.Tensor], metadata: dict) -> Iterator[list]:
    """The file's adapters on the base model's components; yields [(key, peft tuner layer)]. Refused with
    one line naming the file when a component, module or shape does not fit. Removed again afterwards."""
    from diffusers.utils.peft_utils import recurse_remove_peft_layers
    from peft import PeftConfig, inject_adapter_in_model
    from peft.tuners.tuners_utils import BaseTunerLayer
    from peft.utils import set_peft_model_state_dict
    mods = components(model)
    touched, layers = [], []
    try:
        for component, config in configs_of(metadata).items():
            if component not in mods:
                raise ConfigError(f"{path}: adapters for '{component}', which a {model.family.label} model does not "
                                  f"have (it has {', '.join(mods)})")
            module = mods[component]
            prefix = component + "."
            sub = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
            touched.append(module)
            try:
                inject_adapter_in_model(PeftConfig.from_peft_type(**config), module, adapter_name=ADAPTER)
                result = set_peft_model_state_dict(module, sub, adapter_name=ADAPTER)
            except (ValueError, RuntimeError, KeyError, TypeError) as e:
                first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                raise ConfigError(f"{path}: does not fit the base model ({model.family.label}) {component}: "
                                  f"{first[:300]}") from None
            unexpected = list(getattr(result, "unexpected_keys", []) or [])
            missing = [k for k in getattr(result, "missing_keys", []) or [] if f".{ADAPTER}" in k]
            if unexpected or missing:
                bad = unexpected or missing
                raise ConfigError(f"{path}: {len(bad)} {component} weights do not fit the base model "
                                  f"({model.family.label}), e.g. {bad[0]}")
            for name, layer in module.named_modules():
                if isinstance(layer, BaseTunerLayer) and ADAPTER in layer.active_adapters:
                    layers.append(((component, name), layer))
        yield layers
    finally:
        for module in touched:
            recurse_remove_peft_layers(module)
            if hasattr(module, "peft_config"):
                with contextlib.suppress(AttributeError):
                    delattr(module, "peft_config")


@torch.no_grad()
def layer_delta(layer, strength: float = 1.0) -> torch.Tensor:
    """ΔW of one tuner layer at `strength` by peft's own merge, in fp32; the base weight is left as it was."""
    base = layer.get_base_layer()
    before = base.weight.detach().clone()
    scaled = strength != 1.0
    if scaled:
        layer.scale_layer(strength)
    try:
        layer.merge(adapter_names=[ADAPTER])
        merged = base.weight.detach().float()
        return merged - before.float()
    finally:
        base.weight.data.copy_(before)
        layer.merged_adapters.clear()
        if scaled:
            layer.unscale_layer(None)   # back to alpha / r (the layer was put on the base with it)


def check(model, path: Path, state: dict, metadata: dict) -> list[Key]:
    """The file fits the base (ConfigError otherwise); the layers it changes."""
    with on_base(model, path, state, metadata) as layers:
        return [key for key, _ in layers]


def deltas(model, path: Path, state: dict, metadata: dict, strength: float = 1.0) -> Iterator[tuple[Key, torch.Tensor]]:
    """(key, ΔW) for every layer the file changes, at `strength` (DoRA's update is not linear in it)."""
    with on_base(model, path, state, metadata) as layers:
        for key, layer in layers:
            yield key, layer_delta(layer, strength)
