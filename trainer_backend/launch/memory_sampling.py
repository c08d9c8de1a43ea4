"""The memory planner's sample round for a model whose frozen experts only sample (Wan 2.2 A14B training one of its
two experts). Pure (no torch), called by launch/memory_plan.plan_memory.

A run's sample round (training/sampling_residency.py) keeps what training keeps on the GPU (the trained expert's
resident blocks, adapters, optimizer state; gradients are freed) and brings the frozen expert in: whole when the
run streams nothing; with memory.block_swap or memory.offload_encoders only its non-block parts for the round and
its blocks one at a time (the block running and the one prefetched), as the trained expert's own swapped blocks
come. On top of that the round runs one part at a time: the text encoder for the prompts, the denoisers' no-grad
forwards (one prompt; guidance runs the negative as a call of its own), the VAE's decode.
"""
from __future__ import annotations

from .memory_tables import DTYPE_BYTES, weight_bytes

DEFAULT_SAMPLE_FRAMES = 17   # Family.sample_frames (families/base.py): a sample clip without --f


def frozen_experts(table: dict, copies: int) -> int:
    """Denoisers of the table's size that only sample: a table whose denoiser_copies rule counts the experts a
    model holds (Wan 2.2: {"option": "model.expert", "values": {"both": 2}}) holds the most of them; those not
    trained (`copies` train) only sample."""
    rule = table.get("denoiser_copies")
    if not rule or rule.get("option") != "model.expert":
        return 0
    return max(0, max(int(v) for v in rule["values"].values()) - copies)


def sample_sizes(cfg, frame_step: int) -> list[tuple[int, int, int]]:
    """(width, height, frames) of each sample prompt (frames 1 for an image family); [] without prompts or with a
    prompt line that does not parse (the config check names it)."""
    from ..config.base import ConfigError
    from ..config.sample_prompts import load_prompts
    try:
        prompts = load_prompts(cfg)
    except (ConfigError, OSError):
        return []
    out = []
    for p in prompts:
        frames = 1
        if frame_step:
            frames = (max(p.frames or DEFAULT_SAMPLE_FRAMES, 1) - 1) // frame_step * frame_step + 1
        out.append((p.width, p.height, frames))
    return out


def sample_round(cfg, table: dict, *, den: dict, copies: int, w_dtype: str, quant: str, streamed: bool,
                 trained_in_flight: float, act_line: list[float], act_factor: float, text_in: float, vae_in: float,
                 vae_decode, frame_step: int) -> dict[str, float]:
    """{"samples": bytes on top of what stays resident} for a model with a frozen expert and sample prompts, else {}.
    den: one expert's table entry; trained_in_flight: the trained expert's swapped blocks on the GPU at once;
    act_line: the table's checkpointed LoRA activation line (a no-grad forward holds no more: each block's input is
    freed once the next block has it), per latent pixel; text_in/vae_in: an offloaded text encoder's/VAE's weights,
    which come in for their own call; vae_decode(latent pixels): the VAE pass's activations."""
    if not frozen_experts(table, copies):
        return {}
    sizes = sample_sizes(cfg, frame_step)
    if not sizes:
        return {}
    scale, at_once = table["vae_scale_factor"], table.get("vae_frames_at_once")
    stored = weight_bytes(den, w_dtype, quant)   # stored as the trained expert's frozen base
    blocks, params = den.get("blocks") or [], den["params"]
    if streamed and blocks:
        # non-block parts in the compute dtype (families keep them unquantized); two neighbouring blocks at once
        fixed = (params - sum(blocks)) * DTYPE_BYTES[w_dtype]
        in_flight = stored * max(map(sum, zip(blocks, blocks[1:])), default=max(blocks)) / params
    else:
        fixed, in_flight = stored, 0.0
    passes = [text_in + table["text_encode"] * 2]   # the prompt and its negative
    for width, height, frames in sizes:
        pixels = (width // scale) * (height // scale)
        latent_frames = (frames - 1) // frame_step + 1 if frame_step else 1
        act = max(0.0, act_line[0] + act_line[1] * pixels * latent_frames) * act_factor
        passes.append(max(in_flight, trained_in_flight) + act)
        passes.append(vae_in + vae_decode(pixels * min(frames, at_once or frames)))
    return {"samples": fixed + max(passes)}
