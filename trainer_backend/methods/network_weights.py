"""network.network_weights: adapters that start from an existing LoRA file (kohya's
`--network_weights`) instead of from scratch.

The file may be this studio's own output (any family's layout, or the peft layout of DoRA/LoHa/LoKr),
a kohya/webui file or a diffusers file; the family reads it into peft's layout
(`Family.read_lora_file`). Every weight must land on a configured adapter of the same shape:
anything else is refused naming the key, with both shapes. The rank is not taken from the file
(the message says the file's); a different alpha is folded into lora_B, so the adapters start with
exactly the file's effect. A resumed checkpoint loads after this and wins (run/checkpointer.py).
"""
from __future__ import annotations

import json
import logging
from pathlib import Path

import torch

from ..config import ConfigError, TrainConfig
from ..file_limits import check_float_weights

LOG = logging.getLogger("trainer")
KEY = "network.network_weights"


def read_file(path_text: str) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    from safetensors import SafetensorError, safe_open
    path = Path(path_text).expanduser()
    if not path.is_file():
        raise ConfigError(f"{KEY}: {path} does not exist")
    try:
        with safe_open(str(path), framework="pt") as f:
            check_float_weights(KEY, path, {k: f.get_slice(k).get_dtype() for k in f.keys()})
            return {k: f.get_tensor(k) for k in f.keys()}, dict(f.metadata() or {})
    except (SafetensorError, OSError, ValueError) as e:
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(f"{KEY}: {path} is not a readable .safetensors file ({e})") from None


def _peft_file(state: dict, header: dict, modules: dict, cfg: TrainConfig):
    """This studio's peft-layout file (DoRA, LoHa, LoKr): keys are `<component>.<peft key>` already;
    its adapters were built with an alpha of their own, which must be the configured one."""
    from ..families.lora_files import LoraWeights
    from .variants import METADATA_KEY
    packed = json.loads(header[METADATA_KEY])
    for component in modules:
        alpha = packed.get(f"{component}.lora_alpha", packed.get(f"{component}.alpha"))
        if alpha is not None and float(alpha) != cfg.network.alpha:
            raise ConfigError(f"network.alpha: the file in {KEY} was trained with alpha {float(alpha):g}; set "
                              f"network.alpha = {float(alpha):g} to start from it")
    out = LoraWeights(layout="peft")
    for key, tensor in state.items():
        component, rest = key.split(".", 1)
        out.weights.setdefault(component, {})[rest] = tensor
    return out


def load_network_weights(model, modules: dict[str, torch.nn.Module], cfg: TrainConfig, alpha) -> None:
    """Copy the file's weights into the adapters just added to `modules` (component -> module);
    alpha: (component, module) -> the configured alpha (methods/lora.py alpha_for_module)."""
    from peft.utils import get_peft_model_state_dict, set_peft_model_state_dict
    from .variants import METADATA_KEY
    state, header = read_file(cfg.network.network_weights)
    if METADATA_KEY in header:
        found = _peft_file(state, header, modules, cfg)
    else:
        found = model.family.read_lora_file(model, state, modules)
    loaded, folded = 0, set()
    for component, weights in found.weights.items():
        if component not in modules:
            raise ConfigError(f"{KEY}: the file has {component} adapters, which this run does not train "
                              f"(network.train_text_encoder is off)")
        expected = get_peft_model_state_dict(modules[component])
        for key, tensor in weights.items():
            _check(component, key, tensor, expected, found.layout)
            module, part = key.rsplit(".", 2)[0], key.rsplit(".", 2)[1]
            scale = found.scales.get((component, module))
            if scale is not None and part == "lora_B":
                rank = weights[f"{module}.lora_A.weight"].shape[0]
                ours = alpha(component, module) / rank
                if abs(scale - ours) > 1e-12 * max(abs(ours), 1.0):
                    tensor = tensor.float() * (scale / ours)  # the update the file applies, under our alpha
                    folded.add(round(scale * rank, 6))
            weights[key] = tensor.to(expected[key].dtype)
        result = set_peft_model_state_dict(modules[component], weights)
        if getattr(result, "unexpected_keys", None):
            raise ConfigError(f"{KEY}: {result.unexpected_keys[0]} does not fit the configured {component} adapters")
        loaded += len(weights)
        missing = [k for k in expected if k not in weights]
        if missing:
            LOG.warning("%s: %d %s adapter weights are not in the file and start from scratch (e.g. %s)",
                        KEY, len(missing), component, missing[0])
    LOG.info("%s: adapters start from %s (%s layout, %d weights)%s", KEY, cfg.network.network_weights,
             found.layout, loaded, f"; the file's alpha {sorted(folded)} folded into lora_B for network.alpha "
             f"{cfg.network.alpha:g}" if folded else "")


def _check(component: str, key: str, tensor: torch.Tensor, expected: dict, layout: str) -> None:
    if key not in expected:
        module = key.rsplit(".", 2)[0]
        raise ConfigError(f"{KEY}: the file ({layout} layout) has an adapter on {component} {module}, which the "
                          f"configured network does not (network.target_modules, conv_rank, exclude_modules)")
    want = tuple(expected[key].shape)
    if tuple(tensor.shape) != want:
        rank = tensor.shape[0] if ".lora_A." in key else tensor.shape[1] if tensor.ndim > 1 else "?"
        raise ConfigError(f"{KEY}: {component} {key} has shape {tuple(tensor.shape)} in the file but "
                          f"{want} in the configured network (the file's rank here is {rank}: set network.rank, "
                          f"or network.conv_rank for a convolution, to match)")
