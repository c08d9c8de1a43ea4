"""model.quantize / model.quantize_text_encoders: the frozen base stored quantized.

After loading and before adapters, the plain `torch.nn.Linear` layers of the UNet/transformer
(and of the text encoders) get int8 or float8 weight-only storage (torchao's `quantize_`) or
NF4 4-bit storage (bitsandbytes' `Linear4bit`). Activations, convolutions, norms, embeddings
and the layers a family or the model class keeps in full precision are left alone. peft then
wraps the quantized layers with its own torchao/bitsandbytes LoRA layers; the adapters are fp32
tensors of their own, so checkpoints and the saved LoRA file are the same as without
quantization. Nothing here knows the family: it names what to keep (`Family.keep_unquantized`).
"""
from __future__ import annotations

import fnmatch
import logging

import torch

from ..errors import ConfigError

LOG = logging.getLogger("trainer")
KINDS = ("int8", "float8", "nf4")
PACKAGES = {"int8": "torchao", "float8": "torchao", "nf4": "bitsandbytes"}
MARK = "_studio_quantized"   # set on a quantized module: its kind


def quantized_kind(module) -> str:
    """The kind a module was quantized with ("" when it was not)."""
    return getattr(module, MARK, "") if module is not None else ""


def kept(name: str, patterns) -> bool:
    """A layer stays unquantized when a pattern equals one of its dotted name's parts
    ("time_embedding", transformers' `_keep_in_fp32_modules` style) or globs its whole name."""
    parts = name.split(".")
    return any(p in parts or fnmatch.fnmatchcase(name, p) for p in patterns)


def quantizable_linears(module: torch.nn.Module, keep=()) -> list[str]:
    """Qualified names of the layers `quantize_module` would quantize."""
    patterns = (*keep, *(getattr(module, "_keep_in_fp32_modules", None) or ()))
    return [name for name, m in module.named_modules()
            if type(m) is torch.nn.Linear and not kept(name, patterns)]


def quantize_module(module: torch.nn.Module, kind: str, *, device, compute_dtype: torch.dtype, keep=(),
                    key: str = "model.quantize", host: list[torch.nn.Module] = ()) -> int:
    """Quantize `module`'s plain Linear layers in place, on `device` (each layer moves there as it is
    quantized, so the full-precision copy never has to fit on the GPU), then move the rest there.
    `host`: submodules that stay in CPU memory (memory.block_swap's blocks): each is quantized on
    `device` in its turn (the same numbers as the others) and sent back before the next one.
    Returns how many layers were quantized. `key` is the option named when it cannot be done."""
    if kind == "none":
        module.to(device, dtype=compute_dtype)
        return 0
    if kind not in KINDS:
        raise ConfigError(f"{key}: unknown quantization {kind!r}; choose none, {', '.join(KINDS)}")
    module.to(dtype=compute_dtype)  # still where it was loaded (CPU)
    names = quantizable_linears(module, keep)
    device = torch.device(device)
    todo = [n for n in names if not _stored_float8(module.get_submodule(n), kind, compute_dtype)]
    layers = dict(module.named_modules())
    parts = [{id(m) for m in part.modules()} for part in host]
    groups = [[n for n in todo if not any(id(layers[n]) in ids for ids in parts)]]
    groups += [[n for n in todo if id(layers[n]) in ids] for ids in parts]
    for group, part in zip(groups, (None, *host)):
        if group and kind == "nf4":
            _to_nf4(module, group, device, compute_dtype, key)
        elif group:
            _torchao(module, group, kind, device, key)
        if part is not None:
            _move(part, torch.device("cpu"))
    if host:
        _move(module, device, skip={id(t) for part in host for t in (*part.parameters(), *part.buffers())})
    else:
        module.to(device)
    module.requires_grad_(False)
    setattr(module, MARK, kind)
    LOG.info("%s = %s: %d linear layers of the %s quantized (weights %.1f MB)%s", key, kind, len(names),
             type(module).__name__, weight_bytes(module) / 2**20,
             f"; {len(names) - len(todo)} arrived stored so from the model file" if len(todo) < len(names) else "")
    return len(names)


def float8_rows(qdata: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A Linear weight in torchao's float8 weight-only storage (what Float8WeightOnlyConfig makes: float8_e4m3fn
    values and an fp32 scale per output row) from float8 values and their scale as they are: a file's scaled
    fp8 weight is adopted without passing through a wider copy. `scale`: one per tensor or one per row."""
    from torchao.quantization import Float8Tensor
    rows, cols = qdata.shape
    scale = scale.to(torch.float32).reshape(-1, 1).expand(rows, 1).contiguous()
    return Float8Tensor(qdata, scale, block_size=[1, cols], dtype=dtype)


def float8_from(weight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A Linear weight quantized as Float8WeightOnlyConfig quantizes it (per-row scale), one layer at a time."""
    from torchao.quantization import Float8Tensor, PerRow
    return zero_rows_kept(Float8Tensor.from_hp(weight.to(dtype), float8_dtype=torch.float8_e4m3fn,
                                               granularity=PerRow()))


def zero_rows_kept(weight):
    """A float8 weight whose all-zero rows stay zero: torchao (0.18) gives such a row the scale 0 and stores
    0/0, so the layer's output turns NaN (a left-out part filled with zeros, a zero-initialised layer). Those
    rows get scale 1 and zero values; every other row is left as torchao made it."""
    zero = weight.scale == 0
    if bool(zero.any()):
        weight.scale.masked_fill_(zero, 1.0)
        weight.qdata.view(torch.uint8).masked_fill_(zero.expand(weight.qdata.shape), 0)
    return weight


def _stored_float8(layer: torch.nn.Module, kind: str, dtype: torch.dtype) -> bool:
    """A layer whose weight arrived in float8 storage (families/component_files.py streams fp8 files so):
    nothing to quantize; its output dtype follows the run's compute dtype (Module.to leaves it)."""
    weight = layer.weight
    if kind != "float8" or type(weight).__name__ != "Float8Tensor":
        return False
    if weight.dtype != dtype:
        layer.weight = torch.nn.Parameter(float8_rows(weight.qdata, weight.scale, dtype), requires_grad=False)
    return True


def _move(module: torch.nn.Module, device: torch.device, skip=frozenset()) -> None:
    """Every weight and buffer of `module` (but those in `skip`) on `device`, quantized ones whole
    (torchao's inner tensors, nf4's quant_state); each keeps its Parameter object."""
    from .weight_storage import copy_quant_state, copy_storage, install, quant_state_of, storage_of
    for t in {id(t): t for t in (*module.parameters(), *module.buffers())}.values():
        if id(t) in skip:
            continue
        install(t, copy_storage(storage_of(t), lambda x: x.to(device)))
        state = quant_state_of(t)
        if state is not None:
            t.quant_state = copy_quant_state(state, lambda x: x.to(device))


def _torchao(module: torch.nn.Module, names: list[str], kind: str, device: torch.device, key: str) -> None:
    try:
        from torchao.quantization import Float8WeightOnlyConfig, Int8WeightOnlyConfig, quantize_
    except ImportError as e:
        raise ConfigError(f"{key}: {kind} needs the torchao package (.venv/bin/pip install torchao): {e}") from None
    config = Int8WeightOnlyConfig() if kind == "int8" else Float8WeightOnlyConfig()
    wanted = set(names)
    try:
        quantize_(module, config, filter_fn=lambda m, fqn: fqn in wanted, device=device)
    except (RuntimeError, NotImplementedError, AssertionError) as e:
        raise ConfigError(f"{key}: torchao could not quantize to {kind} on {device.type}: {e}") from None
    if kind == "float8":
        for name in names:
            zero_rows_kept(module.get_submodule(name).weight)


def _to_nf4(module: torch.nn.Module, names: list[str], device: torch.device, compute_dtype: torch.dtype,
            key: str) -> None:
    """bitsandbytes' Linear4bit in place of each layer; Params4bit quantizes as it moves to the device."""
    try:
        import bitsandbytes as bnb
    except ImportError as e:
        raise ConfigError(f"{key}: nf4 needs the bitsandbytes package (.venv/bin/pip install bitsandbytes): "
                          f"{e}") from None
    for name in names:
        parent_name, _, child = name.rpartition(".")
        parent = module.get_submodule(parent_name)
        old = getattr(parent, child)
        new = bnb.nn.Linear4bit(old.in_features, old.out_features, bias=old.bias is not None,
                                compute_dtype=compute_dtype, quant_type="nf4", device="meta")
        new.weight = bnb.nn.Params4bit(old.weight.data, requires_grad=False, quant_type="nf4")
        if old.bias is not None:
            new.bias = torch.nn.Parameter(old.bias.data, requires_grad=False)
        try:
            new = new.to(device)
        except (RuntimeError, NotImplementedError, AttributeError) as e:
            raise ConfigError(f"{key}: nf4 needs bitsandbytes' 4-bit kernels on {device.type}, and bitsandbytes "
                              f"{bnb.__version__} has none here ({type(e).__name__}: {str(e)[:160]}); use int8 or "
                              f"float8 (torchao)") from None
        setattr(parent, child, new)
    module.is_loaded_in_4bit = True  # peft wraps Linear4bit layers with its bitsandbytes LoRA layer only then


def _tensor_bytes(t: torch.Tensor) -> int:
    """Bytes a (possibly quantized) weight really occupies: torchao's tensor subclasses by their
    inner tensors, bitsandbytes' Params4bit with its quantization state (absmax, code)."""
    if hasattr(t, "__tensor_flatten__"):
        inner, _ = t.__tensor_flatten__()
        return sum(_tensor_bytes(getattr(t, name)) for name in inner)
    total = t.numel() * t.element_size()
    state = getattr(t, "quant_state", None)
    if state is not None:
        for part in (state.absmax, state.code, getattr(state, "state2", None) and state.state2.absmax,
                     getattr(state, "state2", None) and state.state2.code):
            if isinstance(part, torch.Tensor):
                total += part.numel() * part.element_size()
    return total


def weight_bytes(module: torch.nn.Module) -> int:
    """Bytes of the module's parameters and buffers as stored (quantized ones at their real size)."""
    seen, total = set(), 0
    for t in (*module.parameters(), *module.buffers()):
        if id(t) not in seen:
            seen.add(id(t))
            total += _tensor_bytes(t)
    return total


def ddp_skip_frozen(modules: dict[str, torch.nn.Module]) -> None:
    """DDP broadcasts every parameter of a module it wraps when it starts; the frozen quantized base
    is identical on every rank (each loaded and quantized it) and its tensor subclasses cannot go
    through a collective, so DDP is told to leave the frozen parameters and buffers alone."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    for module in modules.values():
        if quantized_kind(module):
            names = [n for n, p in module.named_parameters() if not p.requires_grad]
            names += [n for n, _ in module.named_buffers()]
            DDP._set_params_and_buffers_to_ignore_for_model(module, names)
