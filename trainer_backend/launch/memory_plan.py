"""The memory planner: a config's peak GPU memory before launch, a verdict per card, and the options
that would make it fit. Pure (no torch): the studio, the CLI `plan` and the tests call it.

Two kinds of phase, and the peak is the largest of them:
- the cache pass, before the denoiser is on the GPU (training/setup.py places it only after the
  caches are built): the encoders and one cache batch of dataset.text_cache_batch_size captions
  or dataset.latent_cache_batch_size images (latents);
- each phase of a training step: what stays on the GPU (weights, trainable parameters, optimizer
  state, EMA) plus what the phase adds: the text encoders' forward, the VAE's encode, the denoiser's
  forward and backward (activations measured on the full-size model, launch/memory_tables.py), and
  the optimizer step (gradients and the optimizer's temporaries).
This is the allocator's `max_memory_allocated` peak; a card also holds the CUDA context and the
allocator's slack (OVERHEAD_GIB, FRAGMENTATION).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .memory_tables import (DTYPE_BYTES, GiB, largest_layer, largest_trained_tensor,
                            optimizer_state_bytes, optimizer_temp_bytes, pipeline_outside_table, trainable_tensors,
                            variant_names, weight_bytes)

CARDS_GB = (8, 12, 16, 24, 48, 80)
OVERHEAD_GIB = 0.6     # CUDA context, cuBLAS/cuDNN handles: outside max_memory_allocated
FRAGMENTATION = 0.05   # the caching allocator reserves more than it hands out
TIGHT = 0.92           # above this share of a card: "tight" (a desktop or a sample pass may tip it)
MIXED_DTYPE = {"no": "fp32", "bf16": "bf16", "fp16": "fp16"}
# The VAE encode's peak on CUDA over the meta-device tally of its tensors (tools/make_memory_tables.py).
# Measured (bench/measured_h100.json, bench/measured_h200.json): SDXL at 1024 px and SD1.5 at 512 px with
# gradient checkpointing peak in the VAE encode 0.23-0.69 GiB (27-37% of the tally) above the plan
# without it. The tally counts tensors only; the fp32 convolutions at full resolution also take cuDNN
# workspace from the same allocator, the likely cause (not isolated on the GPU).
VAE_ENCODE_CUDA = 1.3
PIXEL_BYTES = 12       # an RGB pixel in fp32, as the VAE reads it


def opt(cfg, dotted: str, default: Any = None) -> Any:
    """An option that another branch may not have added yet (model.quantize, memory.block_swap…)."""
    section, key = dotted.split(".")
    return getattr(getattr(cfg, section, None), key, default)


def has_option(cfg, dotted: str) -> bool:
    section, key = dotted.split(".")
    return key in getattr(type(getattr(cfg, section, None)), "model_fields", {})


@dataclass
class MemoryPlan:
    arch: str
    side: tuple[int, int]                 # the largest bucket (width, height) the plan assumed
    resident: dict[str, float]            # what stays on the GPU all step, bytes
    phases: dict[str, float]              # what each phase adds on top, bytes
    counts: dict[str, int]                # parameter counts
    notes: list[str] = field(default_factory=list)
    grads: float = 0.0                    # gradient bytes after a backward pass (fused backward: 0)
    # the cache pass, before the denoiser is placed: phase -> {part: bytes on the GPU}, the whole of it
    cache_phases: dict[str, dict[str, float]] = field(default_factory=dict)
    latent_frames: int = 1                # a video family's clips: latent frames of the longest window

    def phase_totals(self) -> dict[str, float]:
        """Bytes on the GPU at each phase's peak: a cache phase's parts, or a step phase on top of
        what stays resident during training."""
        base = sum(self.resident.values())
        return {**{k: sum(parts.values()) for k, parts in self.cache_phases.items()},
                **{k: base + v for k, v in self.phases.items()}}

    @property
    def peak_bytes(self) -> float:
        return max(self.phase_totals().values(), default=sum(self.resident.values()))

    @property
    def peak_gib(self) -> float:
        return self.peak_bytes / GiB

    @property
    def peak_phase(self) -> str:
        totals = self.phase_totals()
        return max(totals, key=totals.get) if totals else ""

    def needed_gib(self) -> float:
        """What the card must hold: the peak plus the allocator's slack and the CUDA context."""
        return self.peak_gib * (1 + FRAGMENTATION) + OVERHEAD_GIB

    def verdict(self, card_gb: float) -> str:
        need = self.needed_gib()
        return "fits" if need <= TIGHT * card_gb else "tight" if need <= card_gb else "will not fit"

    def to_dict(self) -> dict:
        return {"arch": self.arch, "side": list(self.side), "peak_gib": round(self.peak_gib, 3),
                "needed_gib": round(self.needed_gib(), 3), "peak_phase": self.peak_phase,
                "resident_gib": {k: round(v / GiB, 3) for k, v in self.resident.items()},
                "phases_gib": {k: round(v / GiB, 3) for k, v in self.phases.items()},
                "cache_phases_gib": {k: {p: round(v / GiB, 3) for p, v in parts.items()}
                                     for k, parts in self.cache_phases.items()},
                "phase_totals_gib": {k: round(v / GiB, 3) for k, v in self.phase_totals().items()},
                "counts": self.counts, "notes": self.notes}


def largest_side(cfg, buckets=None) -> tuple[int, int]:
    """The largest bucket by area (the dataset's, when scanned), else resolution²."""
    if buckets:
        return tuple(max(buckets, key=lambda b: (b[0] * b[1], b)))
    return (cfg.dataset.resolution, cfg.dataset.resolution)


def clip_frames(cfg, arch: str, buckets=None) -> tuple[int, int]:
    """(frames, latent frames) of the longest training window: (1, 1) for an image family. A video
    family's frame buckets are (width, height, frames) when the dataset was scanned; else the longest
    count its frame rule (k * frame_step + 1) allows up to dataset.video_frames (or the longest frame
    bucket asked for)."""
    from ..families.registry import FAMILY_NAMES, entry
    step = entry(arch).frame_step if arch in FAMILY_NAMES else 0
    if not step:
        return 1, 1
    clip_buckets = [b[2] for b in buckets or () if len(b) > 2]
    if clip_buckets:
        frames = max(clip_buckets)
    else:
        cap = int(opt(cfg, "dataset.video_frames", 1) or 1)
        asked = [n for n in opt(cfg, "dataset.video_frame_buckets", []) or [] if n <= cap]
        frames = max(asked) if asked else (cap - 1) // step * step + 1
    return frames, (frames - 1) // step + 1


def reference_images(cfg, arch: str) -> int:
    """Reference images whose tokens an edit pair adds to the denoiser's sequence beyond what the family's
    table was measured with: a family that generates and edits (control images "optional": Krea 2,
    Qwen-Image 2.1, Flux.2) is measured on captions alone, so a config that names a control folder plans
    one reference per pair at the target's size (an edit-only model's table already holds its references)."""
    from ..families.registry import FAMILY_NAMES, entry
    if arch not in FAMILY_NAMES or entry(arch).control_images != "optional":
        return 0
    folders = [cfg.dataset.control_path] + [s.control_path for s in cfg.dataset.subsets]
    return 1 if any(folders) else 0


def denoiser_copies(table: dict, cfg) -> int:
    """How many denoisers of the table's size train at once: a table may say an option doubles it
    (Wan 2.2's model.expert = both keeps both experts on the device): {"option": key, "values": {v: n}}."""
    rule = table.get("denoiser_copies")
    if not rule:
        return 1
    return int(rule["values"].get(str(opt(cfg, rule["option"], "")), 1))


def activation_lines(table: dict, cfg) -> dict:
    """The table's activation lines, or the ones it measured with an option on that makes every step bigger
    (Wan 2.2 TI2V-5B's start images: per-token timesteps): {"option": key, "lines": {...}}."""
    rule = table.get("activations_if")
    if rule and opt(cfg, rule["option"], 0):
        return rule["lines"]
    return table["activations"]


def text_every_step(table: dict, cfg, arch: str = "") -> bool:
    """The text encoder runs every step although its outputs are cached: a family whose encoder reads an
    edit pair's control image (the table's text_every_step) caches a pair's text only once the latents are
    cached too, which fixes the control image's crop (training/setup.cache_pair_text). A family that also
    generates (control images optional) does so only for a config with pairs (reference_images)."""
    from ..families.registry import FAMILY_NAMES, entry
    optional = arch in FAMILY_NAMES and entry(arch).control_images == "optional"
    return (bool(table.get("text_every_step")) and not cfg.dataset.cache_latents
            and (not optional or reference_images(cfg, arch) > 0))


def condition_every_step(table: dict, cfg) -> bool:
    """The family builds conditions from a step's pixels with the VAE (the table's condition_pass: Wan I2V's
    first-frame condition), which dataset.cache_latents caches beside the latents (Family.pixel_conditions)."""
    return bool(table.get("condition_pass")) and not cfg.dataset.cache_latents


def condition_bytes(table: dict, frame_pixels: int, chunk: int, frames: int) -> float:
    """An uncached step's condition pass on one clip on a CUDA card, a phase of its own before the denoiser's
    forward: its line (measured on one frame) with the VAE encoding `chunk` frames at once instead of one (a
    causal VAE: per chunk, not per latent frame) and the clip's other frames held twice as fp32 pixels (the
    clip, and the first frame ++ black frames the VAE encodes). Checked on a tiny model against the real pass
    (tests/test_i2v_memory_plan.py: at or above its peak, within 1.3x)."""
    one = _act(table["condition_pass"], frame_pixels)
    pixels_held = 2 * PIXEL_BYTES * table["vae_scale_factor"] ** 2 * frame_pixels * (frames - chunk)
    return (one + _act(table["vae_encode"], frame_pixels) * (chunk - 1) + pixels_held) * VAE_ENCODE_CUDA


def _act(line: list[float], pixels: int) -> float:
    return max(0.0, line[0] + line[1] * pixels)


def vae_encode_bytes(table: dict, pixels: int) -> float:
    """What one image's VAE encode adds on a CUDA card (the table's tally × VAE_ENCODE_CUDA)."""
    return _act(table["vae_encode"], pixels) * VAE_ENCODE_CUDA


def swap_held_share(den: dict, denoiser_w: float, w_dtype: str, blocks: list[int]) -> float:
    """Share of the denoiser's weight bytes on the GPU at the forward/backward's peak with block swap,
    without gradient checkpointing, when the weights run in their stored dtype (frozen LoRA bases,
    half-precision full fine-tunes). Autograd saves each Linear layer's `weight.t()`, a view that keeps
    the device copy the swap's forward made, until that layer's backward: only the swapped blocks'
    other weights (convolutions, norms) leave. The backward then fetches each swapped block whole again
    while autograd's copy of its Linear weights is still there: the largest swapped block counted once
    more. (The likely mechanism, read from training/block_swap.py, not isolated on a GPU.) Measured on an
    H200 (SDXL LoRA, 1024 px, block_swap=5 of 7): the peak rose 0.46 GiB while the denoiser's parameters
    on the device fell 1.66 GiB. The backward's prefetch of the previous block is left out: by then the
    later blocks' activations are freed."""
    params = den["params"]
    linear = max(0.0, 1 - (params - den["quantizable"][0]) * DTYPE_BYTES[w_dtype] / denoiser_w)
    swapped, largest = sum(blocks) / params, max(blocks) / params
    return 1 - (1 - linear) * (swapped - largest) + linear * largest


def plan_memory(cfg, arch: str | None = None, buckets=None, table: dict | None = None) -> MemoryPlan | None:
    """The memory plan of `cfg` (arch: model.arch, or the detected family when it is "auto");
    None when the family has no table (a family added without running tools/make_memory_tables.py).
    table: a family table to use instead of assets/memory_tables.json's (tests: a tiny model's)."""
    from .model_size import planning_arch, sized_table
    arch = arch or planning_arch(cfg)
    table = table or sized_table(arch, cfg.model.path)
    if table is None or pipeline_outside_table(table, cfg.model.path):
        return None
    net, prec, ds = cfg.network, cfg.precision, cfg.dataset
    comps = table["components"]
    den = comps[table["denoiser"]]
    w_dtype = MIXED_DTYPE[prec.mixed]
    full = net.type == "full"
    half_weights = full and (prec.full_bf16 or prec.full_fp16)
    train_dtype = w_dtype if half_weights else "fp32"  # adapters and full fine-tunes train fp32 masters
    train_bytes = DTYPE_BYTES[train_dtype]
    quant = opt(cfg, "model.quantize", "none") if not full else "none"
    te_quant = opt(cfg, "model.quantize_text_encoders", "none")
    swap = int(opt(cfg, "memory.block_swap", 0) or 0)
    offload = bool(opt(cfg, "memory.offload_encoders", False))
    fused_bw = bool(opt(cfg, "optimizer.fused_backward", False))
    batch = cfg.schedule.batch_size
    side = tuple(largest_side(cfg, buckets)[:2])
    scale = table["vae_scale_factor"]
    pixels = (side[0] // scale) * (side[1] // scale)
    notes: list[str] = []
    frames, latent_frames = clip_frames(cfg, arch, buckets)
    # the VAE encode line is per frame too; a causal video VAE (Wan's) encodes a few frames at a time
    chunk = min(frames, table.get("vae_frames_at_once") or frames)
    # one that encodes a clip at once shrinks time as it goes (LTX-2's): each further frame adds a share of one
    share = table.get("vae_frame_share")
    frame_pixels, vae_pixels = pixels, pixels * (1 + (frames - 1) * share if share is not None else chunk)
    if frames > 1:   # the tables' activations are per latent pixel of one frame; a clip's scale with its frames
        pixels *= latent_frames
        notes.append(f"clips of {frames} frames ({latent_frames} latent frames) at {side[0]}x{side[1]}")
    act_pixels = pixels * (1 + reference_images(cfg, arch))  # the denoiser's image tokens, references included
    if act_pixels > pixels:
        notes.append("edit pairs: each pair's reference image adds as many tokens as its target (planned with one "
                     "reference per pair)")
    copies = denoiser_copies(table, cfg)
    if copies > 1:
        den = {**den, "params": den["params"] * copies, "blocks": list(den.get("blocks", [])) * copies,
               "quantizable": [q * copies for q in den.get("quantizable", [0])]}
        notes.append(f"{copies} denoisers of {den['params'] / copies / 1e9:.1f} B parameters train together")

    # ---- what stays on the GPU
    resident: dict[str, float] = {}
    denoiser_w = den["params"] * train_bytes if full else weight_bytes(den, w_dtype, quant)
    swapped_share = 0.0   # of the denoiser's parameters, in CPU memory outside the forward/backward
    in_flight_share = 0.0   # of those, on the GPU at once during the forward/backward
    blocks: list[int] = []
    if swap and den.get("blocks"):
        blocks = den["blocks"][-swap:]  # training/memory_setup.py swaps the last N blocks
        # the block running and the one its neighbour prefetches (H200, SDXL block_swap=5: the most
        # denoiser bytes on the GPU at once were 0.659 of them, the two largest neighbours' 0.656)
        in_flight = max(map(sum, zip(blocks, blocks[1:])), default=max(blocks))
        swapped_share, in_flight_share = sum(blocks) / den["params"], in_flight / den["params"]
        notes.append(f"block swap: {len(blocks)} of {len(den['blocks'])} denoiser blocks in CPU memory")
    # the VAE and text encoders' passes and the optimizer step run with every swapped block in CPU memory
    # (H200, SDXL LoRA with checkpointing: block_swap=5 took the peak, the VAE encode's, 10.08 -> 5.62 GiB)
    resident["denoiser"] = denoiser_w * (1 - swapped_share)
    net_share = swapped_share - in_flight_share   # swapped out even during the forward/backward
    trained_tes = set(table["trained_text_encoders"]) if net.train_text_encoder else set()
    te_weights: dict[str, float] = {}
    for name in table["text_encoders"]:
        te_dtype = "fp32" if (full and name in trained_tes and not half_weights) else w_dtype
        te_weights[name] = weight_bytes(comps[name], te_dtype,
                                        te_quant if name not in trained_tes or not full else "none")
    te_total = sum(te_weights.values())
    vae_w = comps["vae"]["params"] * 4  # the VAE stays fp32 (fp16 VAEs give NaN)
    if offload and not (trained_tes and not ds.cache_text_encoder_outputs):
        notes.append("text encoders and VAE in CPU memory, moved in only for their pass")
    else:
        resident["text encoders"] = te_total
        resident["vae"] = vae_w
    tensors = trainable_tensors(table, cfg) * copies
    n_trained = sum(tensors)
    if not full:
        resident["adapters"] = n_trained * 4
    name = cfg.optimizer.name
    kahan = half_weights and prec.half_weights_rounding == "kahan"
    state = optimizer_state_bytes(name, tensors, train_bytes, half_weights, kahan, rank=0 if full else net.rank)
    # a full fine-tune's swapped weights take their state along (LoRA adapters are small: ignored)
    resident["optimizer state"] = state * (1 - net_share) if full else state
    if getattr(cfg, "ema", None) is not None and cfg.ema.enabled and cfg.ema.device == "accelerator":
        resident["ema"] = n_trained * 4

    # ---- what each phase adds
    phases: dict[str, float] = {}
    measured = {"float32": 4, "float16": 2, "bfloat16": 2, "bf16": 2, "fp32": 4}[table.get("probe", {}).get("dtype", "bfloat16")]
    act_factor = DTYPE_BYTES[w_dtype] / measured  # measured in bf16: fp32 ("no") doubles activations
    if not ds.cache_text_encoder_outputs or trained_tes or text_every_step(table, cfg, arch):
        phases["text encoders"] = table["text_encode"] * batch + (te_total if "text encoders" not in resident else 0)
    if not ds.cache_latents:
        phases["vae encode"] = vae_encode_bytes(table, vae_pixels) * batch + (vae_w if "vae" not in resident else 0)
    if condition_every_step(table, cfg):
        phases["condition"] = condition_bytes(table, frame_pixels, chunk, frames) * batch + (vae_w if "vae" not in resident else 0)
    gc = prec.gradient_checkpointing
    suffix = "_gc" if gc else ""
    grads = n_trained * train_bytes * ((1 - net_share) if full else 1)
    lines = activation_lines(table, cfg)
    act = _act(lines[("full" if full else "lora") + suffix], act_pixels)
    if full and fused_bw:
        # the "full" line is the probe's peak minus the gradients it leaves (right beside the gradients
        # counted below); a fused backward frees each gradient at once, so its peak is the backward's
        # start, where a full fine-tune holds at least what a LoRA run saves (each layer's input)
        act = max(act, _act(lines["lora" + suffix], act_pixels))
    act *= batch * act_factor
    if full and fused_bw:  # the weight being stepped in the backward: its gradient and one temporary
        act += 2 * largest_layer(den) * train_bytes
    cast_masters = full and not half_weights and w_dtype != "fp32"
    if cast_masters and not gc:
        # autocast's half-precision copies of the fp32 masters are saved for the backward, every layer's
        act += den["params"] * DTYPE_BYTES[w_dtype]
    elif cast_masters and net_share:
        # with checkpointing, those of the swapped blocks wait on the GPU for the backward
        act += den["params"] * net_share * DTYPE_BYTES[w_dtype]
    act += denoiser_w * in_flight_share   # the swapped blocks the forward/backward has on the GPU
    if blocks and not gc and not cast_masters:
        held = denoiser_w * swap_held_share(den, denoiser_w, w_dtype, blocks)
        on_gpu = resident["denoiser"] + denoiser_w * in_flight_share
        if held > on_gpu:
            act += held - on_gpu
            notes.append("block swap without gradient checkpointing: autograd keeps the swapped blocks' "
                         "Linear weights on the GPU until the backward, so the forward/backward's peak "
                         "does not fall (turn on precision.gradient_checkpointing)")
    phases["forward/backward"] = act + (0 if fused_bw else grads)
    temp = optimizer_temp_bytes(name, tensors, train_bytes, fused_bw or half_weights, cfg.optimizer.weight_decay,
                                fused_kernel=cfg.optimizer.fused, largest=largest_trained_tensor(table, cfg),
                                half_weights_rounding=prec.half_weights_rounding if half_weights else None)
    phases["optimizer step"] = (0 if fused_bw else grads) + temp
    from ..families.registry import FAMILY_NAMES, entry
    from .memory_sampling import sample_round  # a frozen expert that only samples (Wan 2.2): its round
    phases.update(sample_round(
        cfg, table, den=den, copies=copies, w_dtype=w_dtype, quant=quant, streamed=bool(swap or offload),
        trained_in_flight=denoiser_w * in_flight_share, act_line=table["activations"]["lora_gc"],
        act_factor=act_factor, text_in=0.0 if "text encoders" in resident else max(te_weights.values(), default=0.0),
        vae_in=0.0 if "vae" in resident else vae_w, vae_decode=lambda px: vae_encode_bytes(table, px),
        frame_step=entry(arch).frame_step if arch in FAMILY_NAMES else 0))
    cache = cache_phases(table, cfg, te_weights, vae_w, trained_tes, offload, vae_pixels, clips=frames > 1,
                         arch=arch)
    counts = {"denoiser": den["params"], "text_encoders": sum(comps[n]["params"] for n in table["text_encoders"]),
              "vae": comps["vae"]["params"], "trainable": n_trained}
    if table.get("note"):
        notes.append(table["note"])
    if not cfg.model.path and variant_names(arch) and "family" not in table:  # e.g. the flux2-dev-lora preset
        notes.append(f"model.path is empty: planned with the {arch!r} table; {', '.join(variant_names(arch))} "
                     "has a table of its own, used once model.path is such a model")
    return MemoryPlan(arch, side, resident, phases, counts, notes, grads=0.0 if fused_bw else grads,
                      cache_phases=cache, latent_frames=latent_frames)


def cache_phases(table: dict, cfg, te_weights: dict[str, float], vae_w: float, trained_tes: set, offload: bool,
                 pixels: int, clips: bool = False, arch: str = "") -> dict[str, dict[str, float]]:
    """The cache pass (dataset.cache_text_encoder_outputs, dataset.cache_latents), before the denoiser is
    on the GPU. Without memory.offload_encoders every encoder and the VAE are on the GPU for both
    caches. With it each encoder comes in for its own call nearly whole (its top-level parts move as
    units: a T5 or Qwen2.5-VL encoder's layer stack is one part), so the largest encoder is counted
    whole; trained encoders never leave (their outputs are not cached then, but they are resident).
    Clips are encoded one window at a time (data/video_dataset.py), images dataset.latent_cache_batch_size."""
    ds = cfg.dataset
    text_cached = ds.cache_text_encoder_outputs and not trained_tes and not text_every_step(table, cfg, arch)
    on_gpu = {"text encoders": sum(te_weights.values()), "vae": vae_w}
    if offload:
        on_gpu = {"text encoders": sum(w for n, w in te_weights.items() if n in trained_tes), "vae": 0.0}
    out: dict[str, dict[str, float]] = {}
    if text_cached:
        parts = dict(on_gpu)
        if offload:  # the largest frozen encoder, in for its call
            parts["text encoders"] += max((w for n, w in te_weights.items() if n not in trained_tes), default=0.0)
        parts["text cache batch"] = table["text_encode"] * opt(cfg, "dataset.text_cache_batch_size", 16)
        out["text cache"] = parts
    if ds.cache_latents:
        parts = dict(on_gpu)
        if offload:
            parts["vae"] = vae_w
        parts["latent cache batch"] = vae_encode_bytes(table, pixels) * (
            1 if clips else opt(cfg, "dataset.latent_cache_batch_size", 4))
        out["latent cache"] = parts
    return out
