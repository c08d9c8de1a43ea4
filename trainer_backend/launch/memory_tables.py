"""The memory planner's tables (assets/memory_tables.json) and the exact byte counts that follow from
them: weights per dtype and quantization, trainable parameters per network type, optimizer state.
Pure: no torch (the studio imports it). The tables come from tools/make_memory_tables.py (full-size
models on the meta device); tests rebuild entries and compare.
"""
from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path

from ..config.memory_rules import FUSED_OPTIMIZERS
from ..training.full_half_precision import ROUNDED_OPTIMIZERS  # pure, like this module

TABLES = Path(__file__).resolve().parents[2] / "assets" / "memory_tables.json"
GiB = 2 ** 30
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
# weight-only quantization of Linear weights (model.quantize, compute/quantize.py), as the libraries
# store it: torchao int8 = an int8 per weight, an fp32 scale and an int8 zero point per output row;
# float8 = a float8 per weight and an fp32 scale per row; bitsandbytes nf4 (Params4bit) = half a byte
# per weight, a uint8 absmax per 64-weight block, an fp32 absmax per 256 of those, and per layer the
# 16-value and 256-value fp32 code tables
# int8_compute/float8_compute (compute/lowbit_linear.py): an 8-bit value per weight and an fp32 scale per row
ROW_BYTES = {"int8": 5, "float8": 4, "int8_compute": 4, "float8_compute": 4}
NF4_LAYER_BYTES = 16 * 4 + 256 * 4
# optimizer state, in multiples of the trained parameter's bytes (fp32 parameters unless said):
# adamw: exp_avg + exp_avg_sq; prodigy: those + s + p0; lion, sgd (momentum): one buffer
STATE_FACTOR = {"adamw": 2.0, "prodigy": 4.0, "lion": 1.0, "sgd": 1.0}
# bitsandbytes 8-bit states: two uint8 tensors plus an fp32 absmax per 256-value block each
EIGHT_BIT_BYTES = 2 + 2 * 4 / 256
BNB_MIN_8BIT = 4096  # smaller tensors keep 32-bit states (bitsandbytes' min_8bit_size)


@lru_cache(maxsize=4)
def _load(path: str) -> dict:
    p = Path(path)
    return json.loads(p.read_text()) if p.is_file() else {"families": {}}


def family_table(arch: str, path: Path = TABLES) -> dict | None:
    return _load(str(path))["families"].get(arch)


def pipeline_outside_table(table: dict, model_path: str) -> str:
    """The pipeline class of a diffusers folder that a family's table does not describe (a variant without
    a table of its own: variant_table), else "". Tables that name no pipelines describe
    every model of their family; single files and builtin: paths are not looked into."""
    described = table.get("pipelines")
    if not described or not model_path:
        return ""
    try:
        index = json.loads((Path(model_path).expanduser() / "model_index.json").read_text())
    except (OSError, ValueError):
        return ""
    name = index.get("_class_name", "") if isinstance(index, dict) else ""
    return name if name and name not in described else ""


def variant_table(arch: str, model_path: str, path: Path = TABLES) -> dict | None:
    """The table of the model at `model_path` when it is a variant of the family that has a table of its
    own (the file's "variants", e.g. Flux.2 dev beside the flux2 table's Klein 4B): a diffusers folder
    whose pipeline class the variant names, or a .safetensors file holding one of its `file_keys` (read
    from the file's header only). None: the family's own table applies (or describes it not)."""
    variants = [v for v in _load(str(path)).get("variants", {}).values() if v.get("family") == arch]
    if not variants or not model_path:
        return None
    src = Path(model_path).expanduser()
    if src.is_dir():
        try:
            name = json.loads((src / "model_index.json").read_text()).get("_class_name", "")
        except (OSError, ValueError, AttributeError):
            return None
        return next((v for v in variants if name in v.get("pipelines", ())), None)
    keys = _safetensors_keys(src) if src.suffix.lower() == ".safetensors" else []
    return next((v for v in variants if any(k.endswith(tuple(v.get("file_keys", ()))) for k in keys)), None)


def variant_names(arch: str, path: Path = TABLES) -> list[str]:
    """The names of the family's variants that have tables of their own ("flux2-dev")."""
    return sorted(k for k, v in _load(str(path)).get("variants", {}).items() if v.get("family") == arch)


def _safetensors_keys(src: Path) -> list[str]:
    """The tensor names of a .safetensors file (its JSON header: 8 bytes of length, then the header)."""
    try:
        with open(src, "rb") as f:
            size = int.from_bytes(f.read(8), "little")
            if not 0 < size < 100_000_000:
                return []
            return [k for k in json.loads(f.read(size)) if k != "__metadata__"]
    except (OSError, ValueError):
        return []


def matches(name: str, targets) -> bool:
    """peft's rule for a list of target names: the module's name is one, or ends with '.' + one."""
    return any(name == t or name.endswith("." + t) for t in targets)


def weight_bytes(component: dict, dtype: str, quantize: str = "none") -> float:
    """A frozen component's bytes: everything in `dtype`, or the weights of the Linear layers
    compute/quantize.py quantizes stored quantized (biases, norms, convolutions, embeddings and the
    layers a family keeps stay in `dtype`)."""
    total = component["params"] * DTYPE_BYTES[dtype]
    if quantize in (None, "", "none"):
        return total
    weights, rows, layers, blocks, groups = component["quantizable"]
    if quantize == "nf4":
        stored = weights / 2 + blocks + groups * 4 + layers * NF4_LAYER_BYTES
    else:
        stored = weights + rows * ROW_BYTES[quantize]
    return total - weights * DTYPE_BYTES[dtype] + stored


def adapter_tensors(component: dict, network, targets, conv_targets=()) -> list[int]:
    """Element counts of every adapter tensor peft adds for network.type lora/loha/lokr (LoKr's are
    an estimate: the LoRA count). Rows matching `targets` get network.rank, rows matching only the
    convolution targets network.conv_rank."""
    out: list[int] = []
    for name, i, o, k, n in component["layers"]:
        if matches(name, targets):
            r = network.rank
        elif network.conv_rank > 0 and k > 0 and matches(name, conv_targets):
            r = network.conv_rank
        else:
            continue
        kk = max(k, 1)
        if network.type == "loha":
            tensors = [o * r, r * i * kk, o * r, r * i * kk]
        else:
            tensors = [r * i * kk, o * r]
            if network.type == "lora" and network.dora:
                tensors.append(o)
        out += tensors * n
    return out


def trainable_tensors(table: dict, cfg) -> list[int]:
    """Element counts of the trained tensors (adapters, or the whole denoiser and trained encoders)."""
    net = cfg.network
    comps = table["components"]
    trained_tes = table["trained_text_encoders"] if net.train_text_encoder else []
    if net.type == "full":
        # the full fine-tune's tensors by size are not in the tables: one entry per component
        return [comps[table["denoiser"]]["params"]] + [comps[name]["params"] for name in trained_tes]
    conv = [t for t in net.conv_target_modules if t not in net.target_modules]
    out = adapter_tensors(comps[table["denoiser"]], net, net.target_modules, conv)
    for name in trained_tes:
        out += adapter_tensors(comps[name], net, net.text_encoder_target_modules)
    return out


def largest_layer(component: dict) -> int:
    """Elements of a component's largest layer weight (a convolution's kernel area included)."""
    return max((i * o * max(k, 1) for _, i, o, k, _ in component.get("layers") or []), default=0)


def largest_trained_tensor(table: dict, cfg) -> int | None:
    """A full fine-tune's largest trained tensor (elements): the denoiser's largest layer weight, or a
    trained text encoder taken whole (its token embedding is most of it; an upper bound). None for
    adapters, whose trainable_tensors are already per tensor."""
    if cfg.network.type != "full":
        return None
    comps = table["components"]
    largest = largest_layer(comps[table["denoiser"]])
    if not largest:
        return None
    trained_tes = table["trained_text_encoders"] if cfg.network.train_text_encoder else []
    return max([largest] + [comps[name]["params"] for name in trained_tes])


def optimizer_state_bytes(name: str, tensors: list[int], param_bytes: int, half_weights: bool,
                          kahan: bool = False, rank: int = 0) -> float:
    """Optimizer state on the GPU for trained tensors of these element counts.
    half_weights: precision.full_bf16/fp16 (bf16 states; Kahan adds a compensation buffer).
    rank: the adapters' rank (0 = a full fine-tune), for Adafactor's factored moments."""
    count = sum(tensors)
    if name in ("adamw8bit", "paged_adamw8bit"):
        if name.startswith("paged"):
            return 0.0  # paged states live in unified memory, paged out when the GPU runs short
        return sum(t * EIGHT_BIT_BYTES if t >= BNB_MIN_8BIT else t * 8 for t in tensors)
    if name == "adafactor":  # an estimate: factored second moments (rows + columns) of matrices: about
        # 1/rank of an adapter's (rank × n) matrices; a tenth of a full model (convolutions, vectors)
        return count * 4 * (1 / rank if rank else 0.1)
    if half_weights and name in ("adamw", "sgd"):
        return count * 2 * STATE_FACTOR[name] + (count * param_bytes if kahan else 0)
    return count * param_bytes * STATE_FACTOR.get(name, 2.0)


# precision.full_bf16/full_fp16's own AdamW/SGD (training/half_precision_optimizers.py) computes each
# weight's update in fp32 temporaries: bytes per element of the largest trained tensor at the step's peak,
# measured with torch.profiler's allocation events (tests/test_memory_plan.py; SGD gets AdamW's, an upper bound)
HALF_WEIGHTS_TEMP_BYTES = {"stochastic": 31, "kahan": 31, "nearest": 20}


def optimizer_temp_bytes(name: str, tensors: list[int], param_bytes: int, fused_backward: bool,
                         weight_decay: float, fused_kernel: bool = False, largest: int | None = None,
                         half_weights_rounding: str | None = None) -> float:
    """What one optimizer step allocates on top: torch's foreach AdamW (the default on CUDA) makes one
    temporary the size of every parameter (the square root of exp_avg_sq); SGD with weight decay makes
    a decayed copy of the gradients. Per-parameter optimizers and a fused backward pass make only
    per-tensor ones, sized by the largest tensor (`largest` where `tensors` lists whole components, as a
    full fine-tune's do); precision.full_bf16's own optimizer several fp32 ones of it; torch's fused
    AdamW/SGD kernel (optimizer.fused) none."""
    if fused_kernel and name in FUSED_OPTIMIZERS:
        return 0.0
    biggest = largest if largest is not None else max(tensors, default=0)
    if half_weights_rounding and name in ROUNDED_OPTIMIZERS:
        return biggest * HALF_WEIGHTS_TEMP_BYTES[half_weights_rounding]
    if fused_backward or not tensors:
        return biggest * param_bytes
    if name == "adamw" or (name == "sgd" and weight_decay > 0):
        return sum(tensors) * param_bytes
    return max(tensors) * param_bytes * 2
