"""network.training_adapter: a frozen "de-distill" LoRA on the base during training steps only (ai-toolkit's
assistant LoRA, ostris's training adapters for Z-Image Turbo / FLUX.1 schnell).

A step-distilled model (Krea 2 Turbo, Z-Image Turbo) trained plainly learns to undo its distillation along
with the concept. With a training adapter that already undoes it applied to the frozen base, the user's
LoRA learns the concept alone; samples and the saved file are without the adapter, so they show the
distilled model + the user's LoRA, as it will be used.

The adapter is a second peft adapter (TRAINING_ADAPTER) on the denoiser's layers, beside the trained
"default" one: it works wherever peft's layers do (a quantized base, block swap: its weights live in the
block), adds its update exactly as diffusers' load_lora_weights would, and is never trainable. Checkpoints,
EMA and the saved LoRA file read only the "default" adapter; a resumed run adds the adapter again here.
Sample rounds switch it off (diffusion/sampling.py training_adapter_off).
"""
from __future__ import annotations

import logging
import re

import torch

from ..config import ConfigError, TrainConfig
from ..diffusion.sampling import TRAINING_ADAPTER
from ..launch.plan import training_adapter_line

LOG = logging.getLogger("trainer")
KEY = "network.training_adapter"


def _read(model, cfg: TrainConfig):
    """The file as families/lora_files.py's LoraWeights, read by the family's own reader (any layout it reads,
    as network.network_weights); its messages name network.training_adapter."""
    from pathlib import Path
    from safetensors import SafetensorError, safe_open
    from ..config.paths import resolve_path
    from ..families.lora_files import KEY as READER_KEY
    from ..file_limits import check_float_weights
    path = Path(resolve_path(cfg.network.training_adapter)).expanduser()
    if not path.is_file():
        raise ConfigError(f"{KEY}: {path} does not exist")
    try:
        with safe_open(str(path), framework="pt") as f:
            check_float_weights(KEY, path, {k: f.get_slice(k).get_dtype() for k in f.keys()})
            state = {k: f.get_tensor(k) for k in f.keys()}
    except (SafetensorError, OSError, ValueError) as e:
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(f"{KEY}: {path} is not a readable .safetensors file ({e})") from None
    try:
        return model.family.read_lora_file(model, state, {model.family.denoiser_name: model.denoiser})
    except ConfigError as e:
        raise ConfigError(str(e).replace(READER_KEY, KEY)) from None


def _modules(weights: dict) -> dict[str, int]:
    """module path -> rank, from peft keys `<module>.lora_A.weight` / `.lora_B.weight`."""
    ranks = {}
    for key, tensor in weights.items():
        module, part = key[:-len(".weight")].rsplit(".", 1)
        if part not in ("lora_A", "lora_B"):
            raise ConfigError(f"{KEY}: {key} is not a LoRA weight (only LoRA files can be a training adapter)")
        if part == "lora_A":
            ranks[module] = tensor.shape[0]
    return ranks


def _check_fits(denoiser: torch.nn.Module, weights: dict, ranks: dict[str, int]) -> None:
    """Every module of the file exists in the denoiser as a layer of the file's shape; refused naming the key."""
    from peft.tuners.tuners_utils import BaseTunerLayer
    named = dict(denoiser.named_modules())
    for key, tensor in weights.items():
        module = key[:-len(".weight")].rsplit(".", 1)[0]
        layer = named.get(module)
        if isinstance(layer, BaseTunerLayer):
            layer = layer.get_base_layer()
        if layer is None or not hasattr(layer, "in_features"):
            raise ConfigError(f"{KEY}: {key} names {module}, which is not a linear layer of this "
                              f"{type(denoiser).__name__} (a LoRA for another model?)")
        if module not in ranks:
            raise ConfigError(f"{KEY}: {key} has no lora_A beside it")
        want = (ranks[module], layer.in_features) if ".lora_A." in key else (layer.out_features, ranks[module])
        if tuple(tensor.shape) != want:
            raise ConfigError(f"{KEY}: {key} has shape {tuple(tensor.shape)} but this model's {module} needs "
                              f"{want} (a LoRA for another model or size?)")


def _config(ranks: dict[str, int], scales: dict[str, float], weight: float):
    """A LoRA config that puts adapters on exactly the file's modules, each with the file's rank and
    alpha (scale * rank), times network.training_adapter_weight."""
    from peft import LoraConfig
    names = sorted(ranks)
    exact = {f"^{re.escape(m)}": m for m in names}  # peft searches patterns as `(.*\.)?pattern$`: ^ = whole path
    rank = max(ranks.values())
    return LoraConfig(r=rank, lora_alpha=rank, target_modules=f"^({'|'.join(re.escape(m) for m in names)})$",
                      rank_pattern={p: ranks[m] for p, m in exact.items()},
                      alpha_pattern={p: scales.get(m, 1.0) * ranks[m] * weight for p, m in exact.items()},
                      init_lora_weights=False, inference_mode=True)


def add_training_adapter(model, cfg: TrainConfig) -> None:
    """Put network.training_adapter on model.denoiser (which already has the trained "default" adapter),
    frozen, active beside the trained one. No-op when the option is empty or the model is the memory
    planner's meta probe."""
    if not cfg.network.training_adapter:
        return
    if cfg.network.type != "lora":
        raise ConfigError(f"{KEY}: applies to LoRA training (network.type = lora); network.type is "
                          f"{cfg.network.type!r}")
    denoiser, name = model.denoiser, model.family.denoiser_name
    if any(p.is_meta for p in denoiser.parameters()):
        return
    found = _read(model, cfg)
    others = sorted(set(found.weights) - {name})
    if others:
        raise ConfigError(f"{KEY}: the file has {others[0]} weights; a training adapter applies to the "
                          f"{name} only")
    weights = found.weights.get(name, {})
    if not weights:
        raise ConfigError(f"{KEY}: the file has no {name} LoRA weights")
    ranks = _modules(weights)
    _check_fits(denoiser, weights, ranks)
    scales = {m: s for (component, m), s in found.scales.items() if component == name}
    from peft.tuners.tuners_utils import BaseTunerLayer
    from peft.utils import set_peft_model_state_dict
    flags = [(p, p.requires_grad) for p in denoiser.parameters()]  # diffusers' set_adapter changes them
    denoiser.add_adapter(_config(ranks, scales, cfg.network.training_adapter_weight), adapter_name=TRAINING_ADAPTER)
    result = set_peft_model_state_dict(denoiser, weights, adapter_name=TRAINING_ADAPTER)
    if getattr(result, "unexpected_keys", None):
        raise ConfigError(f"{KEY}: {result.unexpected_keys[0]} does not fit the model")
    for layer in denoiser.modules():  # every layer computes the adapters it has: the trained one, then this
        if isinstance(layer, BaseTunerLayer):
            layer.set_adapter([n for n in ("default", TRAINING_ADAPTER) if n in layer.lora_A])
    for p, flag in flags:  # the trained adapter's flags as before (network.block_lr may have frozen some)
        p.requires_grad_(flag)
    for pname, p in denoiser.named_parameters():
        if f".{TRAINING_ADAPTER}." in pname:
            p.requires_grad_(False)
    LOG.info("%s (%s layout, %d layers)", training_adapter_line(cfg), found.layout, len(ranks))
