"""Flux transformer files in the original (Black Forest Labs) layout, the one ComfyUI's diffusion
model loader, kohya's tools and diffusers' `from_single_file` read: `double_blocks.N.img_attn.qkv`
(q, k, v fused), `single_blocks.N.linear1` (q, k, v and the MLP input fused), and so on.

Chroma's transformer uses the same layout without the modulation layers and the time, vector and
guidance embedders, plus its `distilled_guidance_layer` (the tables below skip what a model lacks).

One table drives both directions: export fuses diffusers weights; import splits them again with
the sizes of the target model, so any size of Flux (the tiny test model too) round-trips.
"""
from __future__ import annotations

from pathlib import Path

import torch

TOP = [("time_in.in_layer", ["time_text_embed.timestep_embedder.linear_1"]),
       ("time_in.out_layer", ["time_text_embed.timestep_embedder.linear_2"]),
       ("vector_in.in_layer", ["time_text_embed.text_embedder.linear_1"]),
       ("vector_in.out_layer", ["time_text_embed.text_embedder.linear_2"]),
       ("guidance_in.in_layer", ["time_text_embed.guidance_embedder.linear_1"]),
       ("guidance_in.out_layer", ["time_text_embed.guidance_embedder.linear_2"]),
       ("txt_in", ["context_embedder"]), ("img_in", ["x_embedder"]), ("final_layer.linear", ["proj_out"])]
DOUBLE = [("img_mod.lin", ["norm1.linear"]), ("txt_mod.lin", ["norm1_context.linear"]),
          ("img_attn.qkv", ["attn.to_q", "attn.to_k", "attn.to_v"]),
          ("txt_attn.qkv", ["attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj"]),
          ("img_attn.proj", ["attn.to_out.0"]), ("txt_attn.proj", ["attn.to_add_out"]),
          ("img_mlp.0", ["ff.net.0.proj"]), ("img_mlp.2", ["ff.net.2"]),
          ("txt_mlp.0", ["ff_context.net.0.proj"]), ("txt_mlp.2", ["ff_context.net.2"])]
DOUBLE_NORMS = [("img_attn.norm.query_norm.scale", "attn.norm_q.weight"),
                ("img_attn.norm.key_norm.scale", "attn.norm_k.weight"),
                ("txt_attn.norm.query_norm.scale", "attn.norm_added_q.weight"),
                ("txt_attn.norm.key_norm.scale", "attn.norm_added_k.weight")]
SINGLE = [("modulation.lin", ["norm.linear"]),
          ("linear1", ["attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp"]), ("linear2", ["proj_out"])]
SINGLE_NORMS = [("norm.query_norm.scale", "attn.norm_q.weight"), ("norm.key_norm.scale", "attn.norm_k.weight")]
# Chroma's distilled guidance layer (approximator), which replaces Flux's modulation layers and the time,
# vector and guidance embedders; its names in the original layout are what diffusers'
# convert_chroma_transformer_checkpoint_to_diffusers reads
APPROXIMATOR_TOP = [("distilled_guidance_layer.in_proj", ["distilled_guidance_layer.in_proj"]),
                    ("distilled_guidance_layer.out_proj", ["distilled_guidance_layer.out_proj"])]
APPROXIMATOR = [("in_layer", ["linear_1"]), ("out_layer", ["linear_2"])]


def _swap_halves(t: torch.Tensor) -> torch.Tensor:
    """The final norm's (scale, shift) in diffusers is (shift, scale) in the original: swap halves."""
    a, b = t.chunk(2, dim=0)
    return torch.cat([b, a], dim=0)


def _pairs(config: dict) -> list[tuple[str, list[str]]]:
    """(original name, [diffusers names]) of every linear layer (weight and bias), and 1:1 norms."""
    out = []
    for i in range(config["num_layers"]):
        out += [(f"double_blocks.{i}.{o}", [f"transformer_blocks.{i}.{d}" for d in ds]) for o, ds in DOUBLE]
    for i in range(config["num_single_layers"]):
        out += [(f"single_blocks.{i}.{o}", [f"single_transformer_blocks.{i}.{d}" for d in ds]) for o, ds in SINGLE]
    if "approximator_layers" in config:  # Chroma
        out += APPROXIMATOR_TOP
        for i in range(config["approximator_layers"]):
            layer = f"distilled_guidance_layer.layers.{i}"
            out += [(f"{layer}.{o}", [f"{layer}.{d}" for d in ds]) for o, ds in APPROXIMATOR]
    return TOP + out


def _norms(config: dict) -> list[tuple[str, str]]:
    """(original name, diffusers name) of the 1:1 norm scales."""
    out = [(f"double_blocks.{i}.{o}", f"transformer_blocks.{i}.{d}")
           for i in range(config["num_layers"]) for o, d in DOUBLE_NORMS]
    out += [(f"single_blocks.{i}.{o}", f"single_transformer_blocks.{i}.{d}")
            for i in range(config["num_single_layers"]) for o, d in SINGLE_NORMS]
    out += [(f"distilled_guidance_layer.norms.{i}.scale", f"distilled_guidance_layer.norms.{i}.weight")
            for i in range(config.get("approximator_layers", 0))]
    return out


def to_original(state: dict[str, torch.Tensor], config: dict) -> dict[str, torch.Tensor]:
    """diffusers FluxTransformer2DModel (or ChromaTransformer2DModel) weights -> original-layout weights."""
    out: dict[str, torch.Tensor] = {}
    for orig, parts in _pairs(config):
        for kind in ("weight", "bias"):
            names = [f"{p}.{kind}" for p in parts]
            if all(n in state for n in names):
                out[f"{orig}.{kind}"] = torch.cat([state[n] for n in names], dim=0)
    for o, d in _norms(config):
        out[o] = state[d]
    for kind in ("weight", "bias"):
        if f"norm_out.linear.{kind}" in state:  # (Chroma's final norm takes its shift and scale from the approximator)
            out[f"final_layer.adaLN_modulation.1.{kind}"] = _swap_halves(state[f"norm_out.linear.{kind}"])
    return out


def from_original(state: dict[str, torch.Tensor], like: dict[str, torch.Tensor], config: dict) -> dict:
    """Original-layout weights -> diffusers names, split with the shapes of `like` (a state dict of
    the target model). A "model.diffusion_model." prefix (ComfyUI checkpoints) is accepted."""
    state = {k.removeprefix("model.diffusion_model."): v for k, v in state.items()}
    out: dict[str, torch.Tensor] = {}
    for orig, parts in _pairs(config):
        for kind in ("weight", "bias"):
            names = [f"{p}.{kind}" for p in parts]
            if f"{orig}.{kind}" in state and all(n in like for n in names):
                sizes = [like[n].shape[0] for n in names]
                out.update(zip(names, torch.split(state[f"{orig}.{kind}"], sizes, dim=0)))
    for o, d in _norms(config):
        out[d] = state[o]
    for kind in ("weight", "bias"):
        if f"norm_out.linear.{kind}" in like:
            out[f"norm_out.linear.{kind}"] = _swap_halves(state[f"final_layer.adaLN_modulation.1.{kind}"])
    return out


def export_transformer(transformer, out_file: str | Path, dtype=None, metadata: dict[str, str] | None = None) -> Path:
    """The transformer alone as an original-layout `.safetensors` file (written atomically)."""
    from ..component_files import save_transformer_file
    return save_transformer_file(transformer, out_file, lambda state: to_original(state, dict(transformer.config)), dtype, metadata)


def load_transformer_file(path: str | Path, like):
    """A copy of the FluxTransformer2DModel `like` with the weights of an original-layout file."""
    import copy
    from safetensors.torch import load_file
    model = copy.deepcopy(like)
    model.load_state_dict(from_original(load_file(str(path)), model.state_dict(), dict(model.config)))
    return model
