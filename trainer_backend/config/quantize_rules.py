"""The rules of a quantized frozen base (model.quantize, model.quantize_text_encoders; config/rules.py runs
them with the others): only a frozen part can be quantized, nf4 layers take LoRA/DoRA adapters only,
each kind needs its package, and DeepSpeed/FSDP (which own and shard the weights) refuse it. Every kind
combines with memory.block_swap and memory.offload_encoders (training/block_swap.py moves quantized
weights whole: compute/weight_storage.py). Pure;
compute/quantize.py does the work and refuses at load time what only the device can tell (nf4 kernels)."""
from __future__ import annotations

import importlib.util
from typing import Callable, Iterator

from .base import Problem
from .schema import TrainConfig

RULES: list[tuple[str, Callable[[TrainConfig], Iterator[Problem]]]] = []   # (group, rule)
QUANT_PACKAGES = {"int8": "torchao", "float8": "torchao", "nf4": "bitsandbytes",
                  "int8_compute": None, "float8_compute": None}   # the compute kinds need torch alone
COMPUTE_KINDS = ("int8_compute", "float8_compute")               # compute/lowbit_linear.py
ADAPTERS = ("lora", "loha", "lokr")


def _rule(fn):
    RULES.append(("quantize", fn))
    return fn


def quantized_parts(cfg: TrainConfig) -> list[tuple[str, str, bool]]:
    """(key, kind, trained with adapters) of each part asked to be quantized."""
    m, n = cfg.model, cfg.network
    parts = []
    if m.quantize != "none":
        parts.append(("model.quantize", m.quantize, True))
    if m.quantize_text_encoders != "none":
        parts.append(("model.quantize_text_encoders", m.quantize_text_encoders, n.train_text_encoder))
    return parts


@_rule
def _quantize(cfg: TrainConfig) -> Iterator[Problem]:
    n = cfg.network
    for key, kind, adapted in quantized_parts(cfg):
        if n.type == "vae":
            yield Problem(key, "a VAE run trains the autoencoder alone, which is never quantized; set it to \"none\"")
            continue
        if n.type == "full" and adapted:
            what = ("the UNet/transformer" if key == "model.quantize"
                    else "the text encoders (network.train_text_encoder)")
            yield Problem(key, f"network.type = full trains {what} itself and cannot quantize it; quantization is "
                               f"for the frozen base of {'/'.join(ADAPTERS)} training: set it to \"none\"")
            continue
        if kind == "nf4" and adapted and n.type in ("loha", "lokr"):
            yield Problem(key, f"nf4 (bitsandbytes 4-bit) layers take LoRA/DoRA adapters only (peft has no "
                               f"{n.type} layer for them); use int8 or float8, or network.type = lora")
        if kind in COMPUTE_KINDS and n.type != "lora":
            yield Problem(key, f"{kind} replaces the frozen layers under peft's LoRA/DoRA layers only; "
                               f"network.type = {n.type} wraps them otherwise: use int8/float8, or network.type = lora")
        package = QUANT_PACKAGES[kind]
        if package and importlib.util.find_spec(package) is None:
            yield Problem(key, f"{kind} needs the '{package}' package (.venv/bin/pip install {package})")
        if cfg.hardware.strategy != "ddp":
            yield Problem(key, f"hardware.strategy = {cfg.hardware.strategy} shards and casts the model's weights "
                               f"itself and cannot hold quantized ones; use hardware.strategy = ddp")
