"""Measure memory without a GPU: live-byte tallies of real or meta-device work, and the tables the
memory planner (launch/memory_plan.py) reads.

`LiveBytes` is a dispatch mode that counts every tensor storage created while it is active until that
storage is freed, and keeps the peak. On the meta device no data exists, yet shapes, dtypes, what
autograd saves for backward and when it frees it are the same as on a GPU, so a full-size model's
forward and backward give its activation memory exactly as the allocator would see it (minus
fragmentation). tools/make_memory_tables.py runs these probes for every family and writes
assets/memory_tables.json; tests run them on tiny models against real CPU tensors.
"""
from __future__ import annotations

import dataclasses
import re
import weakref
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

GiB = 2 ** 30
# indices of repeated blocks become '#', so a table row stands for every block of the same shape
_INDEX = re.compile(r"((?:^|\.)(?:down_blocks|up_blocks|blocks|attentions|resnets|layers|layer|block|"
                    r"transformer_blocks|single_transformer_blocks|encoder\.block|h))\.\d+(?=\.)")


class LiveBytes(TorchDispatchMode):
    """Bytes of the storages created inside the mode that are still alive; `peak` is the most at once."""

    def __init__(self):
        super().__init__()
        self.live = 0
        self.peak = 0
        self._seen: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()

    def _free(self, nbytes: int) -> None:
        self.live -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {id(t.untyped_storage()) for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)}
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                storage = t.untyped_storage()
                if storage in self._seen or id(storage) in inputs:  # a view or an in-place result
                    continue
                nbytes = storage.nbytes()
                self._seen[storage] = nbytes
                weakref.finalize(storage, self._free, nbytes)
                self.live += nbytes
                self.peak = max(self.peak, self.live)
        return out

    def reset_peak(self) -> None:
        self.peak = self.live


def layer_rows(module: torch.nn.Module) -> list[list]:
    """Linear and Conv2d layers grouped by name pattern and shape: [pattern, in, out, k*k, count]
    (k*k = 0 for a Linear). Adapter parameter counts follow from these (launch/memory_plan.py)."""
    rows: dict[tuple, int] = {}
    for name, m in module.named_modules():
        if isinstance(m, torch.nn.Linear):
            key = (_INDEX.sub(r"\1.#", name), m.in_features, m.out_features, 0)
        elif isinstance(m, torch.nn.Conv2d) and m.groups == 1:
            k = m.kernel_size[0] * m.kernel_size[1]
            key = (_INDEX.sub(r"\1.#", name), m.in_channels, m.out_channels, k)
        else:
            continue
        rows[key] = rows.get(key, 0) + 1
    return [[*k, n] for k, n in sorted(rows.items())]


def component_entry(module: torch.nn.Module, keep=()) -> dict:
    """What the planner knows of one component: its exact parameter count, its layers, and the weights
    and rows of the Linear layers model.quantize would quantize (compute/quantize.py, `keep` = the
    family's keep_unquantized)."""
    from ..compute.quantize import quantizable_linears
    names = quantizable_linears(module, keep)
    layers = [module.get_submodule(n) for n in names]
    sizes = [m.in_features * m.out_features for m in layers]
    blocks = [-(-n // 64) for n in sizes]   # nf4's 64-weight blocks per layer, and their 256-block groups
    return {"params": sum(p.numel() for p in module.parameters()), "layers": layer_rows(module),
            "quantizable": [sum(sizes), sum(m.out_features for m in layers), len(layers), sum(blocks),
                            sum(-(-b // 256) for b in blocks)]}


# ----------------------------------------------------------------------------- autocast on the meta device
class MetaAutocast:
    """torch.autocast's cast policy for the ops that hold activation memory, applied above autograd (as
    autocast is), for the meta device, which torch.autocast does not serve: matmul-like ops run in
    `dtype` (their inputs cast, the cast copies saved by autograd as on a GPU), norms and softmax in
    fp32. Other ops run in their inputs' dtype, as under autocast."""
    LOW = ("linear", "conv2d", "conv3d", "scaled_dot_product_attention")
    FP32 = ("layer_norm", "group_norm", "softmax", "log_softmax")

    def __init__(self, dtype=torch.bfloat16):
        self.dtype = dtype
        self.saved: dict = {}

    @staticmethod
    def _cast(args, kwargs, dtype):
        def c(a):
            return a.to(dtype) if isinstance(a, torch.Tensor) and a.is_floating_point() else a
        return [c(a) for a in args], {k: c(v) for k, v in kwargs.items()}

    def _wrap(self, fn, dtype):
        def wrapped(*args, **kwargs):
            args, kwargs = self._cast(args, kwargs, dtype)
            return fn(*args, **kwargs)
        return wrapped

    def __enter__(self):
        F = torch.nn.functional
        for name in self.LOW + self.FP32:
            self.saved[name] = getattr(F, name)
            fn = fused_attention if name == "scaled_dot_product_attention" else self.saved[name]
            setattr(F, name, self._wrap(fn, self.dtype if name in self.LOW else torch.float32))
        return self

    def __exit__(self, *exc):
        for name, fn in self.saved.items():
            setattr(torch.nn.functional, name, fn)
        self.saved = {}


def fused_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, **kwargs):
    """SDPA as a GPU runs it: a fused kernel (flash for half precision, memory-efficient otherwise and
    with a mask) that keeps only its output and log-sum-exp for backward. The meta device's own SDPA
    is the math path, which would count every attention matrix."""
    if attn_mask is None and query.dtype in (torch.bfloat16, torch.float16) and not kwargs:
        return torch.ops.aten._scaled_dot_product_flash_attention(query, key, value, dropout_p, is_causal,
                                                                  False, scale=scale)[0]
    if attn_mask is not None:
        attn_mask = attn_mask.to(query.dtype).expand(query.shape[0], query.shape[1], query.shape[2], key.shape[2])
    return torch.ops.aten._scaled_dot_product_efficient_attention(query, key, value, attn_mask, True, dropout_p,
                                                                  is_causal, scale=scale)[0]


# ----------------------------------------------------------------------------- full-size probes
def full_size_model(arch: str, tiny_folder: str | Path, components: dict[str, torch.nn.Module]):
    """The tiny model's LoadedModel (tokenizers, scheduler, family) with its modules replaced by the
    full-size ones in `components` (built on the meta device by the caller), the modules a family keeps
    in `LoadedModel.options` too (LTX-2's text connectors) where `components` has one of that name."""
    from ..families import load_model
    tiny = load_model(str(tiny_folder), arch=arch)
    names = tiny.family.text_encoder_names
    vae = components["vae"]
    encoders = [components[n] for n in names]
    for tokenizer, encoder in zip(tiny.tokenizers, encoders):
        # the tiny tokenizers stop at a few dozen tokens; the full-size encoder's positions are the limit
        tokenizer = getattr(tokenizer, "tokenizer", tokenizer)
        text_config = encoder.config.get_text_config() if hasattr(encoder.config, "get_text_config") else encoder.config
        limit = getattr(text_config, "max_position_embeddings", None) or getattr(text_config, "n_positions", 0)
        tokenizer.model_max_length = max(tokenizer.model_max_length, limit or 0)
    # the VAE's own ratio where it states one (LTX-2's 32x: its block count would say 8x)
    scale = getattr(vae, "spatial_compression_ratio", None)
    if not scale and hasattr(vae.config, "block_out_channels"):
        scale = 2 ** (len(vae.config.block_out_channels) - 1)
    elif not scale:  # Qwen-Image's 3D autoencoder: one 2x spatial step per temporal-downsample entry
        scale = 2 ** len(vae.temperal_downsample)
    options = {k: components.get(k, v) for k, v in tiny.options.items()}
    return dataclasses.replace(tiny, denoiser=components[tiny.family.denoiser_name], vae=vae,
                               text_encoders=encoders, vae_scale_factor=scale, options=options)


# a caption longer than any family's text length: every family's tokenizer truncates it to that length,
# so the probe measures the longest text a step can carry (with meta_values.AllValid: all of it valid)
LONG_CAPTION = "a photo of a dog on a beach at sunset, " * 200


def _tokens(model, batch: int):
    return model.family.probe_tokens(model, [LONG_CAPTION] * batch)


def text_conditioning(model, batch: int, device) -> dict:
    with torch.no_grad():
        return model.family.encode_text(model, [t.to(device) for t in _tokens(model, batch)])


def probe_text_encode(model, batch: int, device) -> int:
    """Peak bytes created while the text encoders run (no grad), their outputs included."""
    with LiveBytes() as tally:
        text_conditioning(model, batch, device)
    return tally.peak


def probe_vae_encode(model, side: tuple[int, int], batch: int, device, dtype=torch.float32, frames: int = 1) -> int:
    """Peak bytes created while the VAE encodes a batch of images, or of clips of `frames` frames (no grad),
    the pixels included."""
    with LiveBytes() as tally:
        shape = (batch, 3, side[1], side[0]) if frames == 1 else (batch, 3, frames, side[1], side[0])
        pixels = torch.zeros(*shape, device=device, dtype=dtype)
        with torch.no_grad():
            model.family.encode_latents(model, pixels, None)
    return tally.peak


def _sample(model, side: tuple[int, int], batch: int, device) -> dict:
    """A batch of cached latents (one frame) and text at `side`, as a training step gets it."""
    shape = model.family.latent_shape(model, side[1], side[0])
    text = {k: v for k, v in text_conditioning(model, batch, device).items()}
    sample = {"index": list(range(batch)), "latents": torch.zeros(batch, *shape, device=device),
              "text": text, "original_size": torch.tensor([[side[1], side[0]]] * batch),
              "crop_top_left": torch.zeros(batch, 2, dtype=torch.long),
              "target_size": torch.tensor([[side[1], side[0]]] * batch)}
    if model.family.control_images == "required":  # an edit model: its control images' tokens ride along
        sample["control_latents"] = reference_latents(model, sample["latents"])
    return sample


def probe_condition(model, side: tuple[int, int], batch: int, device) -> int:
    """Peak bytes of the conditions a family builds from a step's pixels (Family.pixel_conditions, no grad:
    Wan I2V's first-frame condition, a VAE encode) on a batch of one-frame images at `side`, the pixels and
    the output included: what an uncached step runs before the denoiser's forward."""
    with LiveBytes() as tally:
        pixels = torch.zeros(batch, 3, side[1], side[0], device=device)
        with torch.no_grad():
            model.family.pixel_conditions(model, pixels)
    return tally.peak


def probe_train_step(model, side: tuple[int, int], batch: int, device, weight_dtype, cfg) -> dict:
    """One forward and backward of the denoiser on cached latents, text and pixel conditions (so only the
    denoiser's own memory counts): the peak bytes created, and the gradient bytes left at the end."""
    from ..diffusion.loss import diffusion_loss
    sample = _sample(model, side, batch, device)
    if model.family.pixel_condition_names:   # cached with the latents: read by the step, built before the tally
        with torch.no_grad():
            sample["conditions"] = model.family.pixel_conditions(
                model, torch.zeros(batch, 3, side[1], side[0], device=device))
    grads_before = _grad_bytes(model.denoiser)
    with LiveBytes() as tally:
        loss = diffusion_loss(model, model.denoiser, sample, cfg=cfg, epoch=0, device=device,
                              weight_dtype=weight_dtype)
        loss.backward()
        grads = _grad_bytes(model.denoiser) - grads_before
        del loss
    return {"peak": tally.peak, "grads": grads}


def reference_latents(model, latents):
    """An edit model's control latents for the probe: as many references as the model takes at most
    (Family.max_control_images), so the plan holds for every dataset."""
    return torch.cat([torch.zeros_like(latents)] * model.family.max_control_images, dim=1)


def _grad_bytes(module) -> int:
    return sum(p.grad.numel() * p.grad.element_size() for p in module.parameters() if p.grad is not None)


# ----------------------------------------------------------------------------- a family's table
class _Device:
    def __init__(self, device):
        self.device = torch.device(device)


def line_through(sides, values, scale) -> list[float]:
    """[a, b]: bytes per sample = a + b × latent pixels, through two measured (side, bytes) points."""
    (s1, s2), (v1, v2) = sides, values
    p1, p2 = (s1 // scale) ** 2, (s2 // scale) ** 2
    b = (v2 - v1) / (p2 - p1)
    return [round(v1 - b * p1), round(b, 3)]


def static_table(model, companions: dict[str, str] | None = None) -> dict:
    """The part of a model's table that needs no probe: its components and how they are named.
    companions: component -> a module of `model.options` that runs with it, on its device and in its
    dtype (LTX-2's text connectors with the text encoder), counted in that component's entry."""
    family = model.family
    keep = getattr(family, "keep_unquantized", ())
    comps = {name: component_entry(m, keep) for name, m in model.components().items()}
    for part, option in (companions or {}).items():
        comps[part] = with_companion(comps[part], component_entry(model.options[option], keep), option)
    # the blocks memory.block_swap moves, in the order the forward runs them (it swaps the last N)
    comps[family.denoiser_name]["blocks"] = [sum(p.numel() for p in b.parameters()) for b in family.blocks(model)]
    return {"denoiser": family.denoiser_name, "text_encoders": list(family.text_encoder_names),
            "trained_text_encoders": list(family.trained_text_encoders or family.text_encoder_names),
            "components": comps, "vae_scale_factor": model.vae_scale_factor, "activations": {},
            # the text encoder reads the control image: it runs every step, whatever the text cache says
            "text_every_step": bool(family.text_reads_control)}


def with_companion(entry: dict, companion: dict, name: str) -> dict:
    """A component's entry with a companion module's parameters and layers added (its layers named
    `<name>.…`); its Linear weights stay out of `quantizable`: model.quantize_text_encoders quantizes
    the text encoders themselves, not what runs beside them."""
    return {**entry, "params": entry["params"] + companion["params"],
            "layers": sorted(entry["layers"] + [[f"{name}.{row[0]}", *row[1:]] for row in companion["layers"]]),
            "with": {**entry.get("with", {}), name: companion["params"]}}


def measure_table(load, overrides: dict, sides: tuple[int, int], device="meta", networks=("lora", "full"),
                  log=print, companions: dict[str, str] | None = None) -> dict:
    """The planner's table for one model (launch/memory_tables.py reads it): `load()` returns a fresh
    LoadedModel in fp32 (full-size modules on the meta device, or a tiny model); each network type is set
    up with the project's own code (place_model, setup_method) from a config of `overrides`, and its
    training step measured at two square sizes, with and without gradient checkpointing."""
    from contextlib import nullcontext
    from .meta_values import AllValid
    dev = torch.device(device)
    answers = AllValid() if dev.type == "meta" else nullcontext()
    with answers:
        table = _measure(load, overrides, sides, dev, networks, log, companions)
    if dev.type == "meta" and answers.asked:
        table["probe"]["assumed"] = "every text token valid (meta device: " + ", ".join(
            f"{name} ×{n}" for name, n in sorted(answers.asked.items())) + ")"
    return table


def _measure(load, overrides: dict, sides: tuple[int, int], dev, networks, log, companions=None) -> dict:
    from ..config import from_dict
    from ..methods import setup_method
    from .setup import place_model

    def load_on_device():   # place_model moves weights by set_data, which cannot cross into the meta device
        loaded = load()
        for module in loaded.components().values():
            module.to(dev)
        return loaded

    model = load_on_device()
    family = model.family
    table = static_table(model, companions)
    base = from_dict({**overrides, "network": {"type": "lora"}})
    weight_dtype = place_model(model, base, _Device(dev))
    text_conditioning(model, 1, dev)   # a first call's one-time casts (LTX-2's connectors) are not a step's
    table["text_encode"] = probe_text_encode(model, 1, dev)
    table["vae_encode"] = line_through(sides, [probe_vae_encode(model, (s, s), 1, dev) for s in sides],
                                       model.vae_scale_factor)
    if family.pixel_condition_names:   # an uncached step's own phase (launch/memory_plan.py), per latent pixel
        table["condition_pass"] = line_through(sides, [probe_condition(model, (s, s), 1, dev) for s in sides],
                                               model.vae_scale_factor)
    for network in networks:
        cfg = from_dict({**overrides, "network": {**overrides.get("network", {}), "type": network}})
        model = load_on_device()
        weight_dtype = place_model(model, cfg, _Device(dev))
        setup_method(model, cfg)
        for gc in (False, True):
            if gc:
                model.denoiser.enable_gradient_checkpointing()
            points = []
            for side in sides:
                with MetaAutocast(weight_dtype):  # in fp32 only its fused attention matters
                    r = probe_train_step(model, (side, side), 1, dev, weight_dtype, cfg)
                for p in model.denoiser.parameters():
                    p.grad = None
                points.append(r["peak"] - r["grads"])
                log(f"{family.name} {network} gc={gc} {side}px: {r['peak'] / GiB:.3f} GiB peak, "
                    f"{r['grads'] / GiB:.3f} GiB grads")
            table["activations"][network + ("_gc" if gc else "")] = line_through(sides, points,
                                                                                 model.vae_scale_factor)
    table["probe"] = {"sides": list(sides), "dtype": str(weight_dtype).removeprefix("torch."),
                      "rank": base.network.rank, "targets": list(base.network.target_modules)}
    return table


# ----------------------------------------------------------------------------- forward FLOPs
def count_flops(run) -> int:
    """FLOPs of `run()` without autograd, as torch.utils.flop_counter counts them (2 per multiply-add
    of matmuls, convolutions and attention; elementwise ops count as zero)."""
    from torch.utils.flop_counter import FlopCounterMode
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        run()
    return counter.get_total_flops()


def forward_flops(model, side: tuple[int, int], batch: int = 1, device="meta") -> int:
    """FLOPs of one forward of the denoiser on a batch of cached latents and text (count_flops;
    elementwise ops count as zero, one reason the step-time estimate calibrates an efficiency factor).
    The text conditioning is built outside the counter: with cached text it is not part of a step."""
    from ..diffusion.loss import diffusion_loss
    from .meta_values import AllValid
    from ..config import from_dict
    dev = torch.device(device)
    with AllValid():
        sample = _sample(model, side, batch, dev)
        cfg = from_dict({"model": {"arch": model.family.name}})
        return count_flops(lambda: diffusion_loss(model, model.denoiser, sample, cfg=cfg, epoch=0, device=dev,
                                                  weight_dtype=torch.float32))


def vae_encode_flops(model, side: tuple[int, int], batch: int = 1, device="meta") -> int:
    """FLOPs of the VAE encoding a batch of images (part of a step when latents are not cached)."""
    pixels = torch.zeros(batch, 3, side[1], side[0], device=torch.device(device))
    return count_flops(lambda: model.family.encode_latents(model, pixels, None))


def flops_table(load, sides: tuple[int, int], device="meta") -> dict:
    """The denoiser's forward FLOPs and the VAE encode's, per sample = a + b × latent pixels, counted
    at two square sizes (launch/step_time.py reads them)."""
    model = load()
    for module in model.components().values():
        module.to(torch.device(device))
    scale = model.vae_scale_factor
    return {"denoiser_forward": line_through(sides, [forward_flops(model, (s, s), 1, device) for s in sides], scale),
            "vae_encode": line_through(sides, [vae_encode_flops(model, (s, s), 1, device) for s in sides], scale),
            "sides": list(sides)}
