"""The SD3 / SD3.5 transformer (MMDiT) in the original (Stability AI) layout, the one of
`sd3.5_large.safetensors`, ComfyUI's loaders, kohya's sd3 scripts and diffusers' `from_single_file`:
`joint_blocks.N.x_block.attn.qkv` (q, k, v fused), `joint_blocks.N.context_block.mlp.fc1`, ...

To the original layout: one table, written here. From it: diffusers' own converter
(`convert_sd3_transformer_checkpoint_to_diffusers`), so what we write is checked against what
diffusers reads (tests/test_sd3_single_files.py, the full-size key sets on the meta device too).
Release files keep the transformer under `model.diffusion_model.` and the autoencoder under
`first_stage_model.`; a full fine-tune's file is written the same way (`export_checkpoint`).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch

PREFIX = "model.diffusion_model."
TOP = [("x_embedder.proj", ["pos_embed.proj"]), ("context_embedder", ["context_embedder"]),
       ("t_embedder.mlp.0", ["time_text_embed.timestep_embedder.linear_1"]),
       ("t_embedder.mlp.2", ["time_text_embed.timestep_embedder.linear_2"]),
       ("y_embedder.mlp.0", ["time_text_embed.text_embedder.linear_1"]),
       ("y_embedder.mlp.2", ["time_text_embed.text_embedder.linear_2"]),
       ("final_layer.linear", ["proj_out"])]
# per joint block: (original module, [diffusers modules fused into it, in order])
BLOCK = [("x_block.attn.qkv", ["attn.to_q", "attn.to_k", "attn.to_v"]),
         ("context_block.attn.qkv", ["attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj"]),
         ("x_block.attn.proj", ["attn.to_out.0"]), ("context_block.attn.proj", ["attn.to_add_out"]),
         ("x_block.attn2.qkv", ["attn2.to_q", "attn2.to_k", "attn2.to_v"]),
         ("x_block.attn2.proj", ["attn2.to_out.0"]),
         ("x_block.adaLN_modulation.1", ["norm1.linear"]), ("context_block.adaLN_modulation.1", ["norm1_context.linear"]),
         ("x_block.mlp.fc1", ["ff.net.0.proj"]), ("x_block.mlp.fc2", ["ff.net.2"]),
         ("context_block.mlp.fc1", ["ff_context.net.0.proj"]), ("context_block.mlp.fc2", ["ff_context.net.2"])]
BLOCK_NORMS = [("x_block.attn.ln_q", "attn.norm_q"), ("x_block.attn.ln_k", "attn.norm_k"),
               ("context_block.attn.ln_q", "attn.norm_added_q"), ("context_block.attn.ln_k", "attn.norm_added_k"),
               ("x_block.attn2.ln_q", "attn2.norm_q"), ("x_block.attn2.ln_k", "attn2.norm_k")]


def swap_halves(t: torch.Tensor) -> torch.Tensor:
    """(shift, scale) in the original is (scale, shift) in diffusers: the final norms' halves swap."""
    a, b = t.chunk(2, dim=0)
    return torch.cat([b, a], dim=0)


def swapped(original: str, num_layers: int) -> bool:
    """The original modules whose output halves are swapped against diffusers'."""
    return original in ("final_layer.adaLN_modulation.1",
                        f"joint_blocks.{num_layers - 1}.context_block.adaLN_modulation.1")


def module_pairs(num_layers: int) -> list[tuple[str, list[str]]]:
    """(original module, [diffusers modules]) of every linear layer the architecture may have."""
    out = list(TOP) + [("final_layer.adaLN_modulation.1", ["norm_out.linear"])]
    for i in range(num_layers):
        out += [(f"joint_blocks.{i}.{o}", [f"transformer_blocks.{i}.{d}" for d in ds]) for o, ds in BLOCK]
    return out


def to_original(state: dict[str, torch.Tensor], config: dict) -> dict[str, torch.Tensor]:
    """diffusers SD3Transformer2DModel weights -> original-layout weights (no prefix)."""
    n = config["num_layers"]
    out = {"pos_embed": state["pos_embed.pos_embed"]}
    for orig, parts in module_pairs(n):
        for kind in ("weight", "bias"):
            names = [f"{p}.{kind}" for p in parts]
            if all(name in state for name in names):
                value = torch.cat([state[name] for name in names], dim=0)
                out[f"{orig}.{kind}"] = swap_halves(value) if swapped(orig, n) else value
    for i in range(n):
        for o, d in BLOCK_NORMS:
            if f"transformer_blocks.{i}.{d}.weight" in state:
                out[f"joint_blocks.{i}.{o}.weight"] = state[f"transformer_blocks.{i}.{d}.weight"]
    return out


def from_original(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Original-layout weights (with or without `model.diffusion_model.`; other components' keys are
    ignored) -> diffusers names, by diffusers' own converter."""
    from diffusers.loaders.single_file_utils import convert_sd3_transformer_checkpoint_to_diffusers
    own = {k.removeprefix(PREFIX): v for k, v in state.items()
           if k.startswith(PREFIX) or not k.startswith(("first_stage_model.", "text_encoders."))}
    return convert_sd3_transformer_checkpoint_to_diffusers(own)


def export_checkpoint(transformer, vae, out_file: str | Path, dtype=None,
                      metadata: dict[str, str] | None = None) -> Path:
    """A full fine-tune's file, laid out like the SD3.5 release files: the transformer under
    `model.diffusion_model.`, the autoencoder under `first_stage_model.` (written atomically; the
    transformer's config in the metadata, so any size loads back)."""
    from safetensors.torch import save_file
    from ..sd.ldm_keys import vae_to_ldm
    state = {k: v.detach() for k, v in transformer.state_dict().items()}
    if any("lora_" in k or ".base_layer." in k for k in state):
        raise ValueError("the model still has adapter layers; merge them (merge_and_unload) before export")
    out = {PREFIX + k: v for k, v in to_original(state, dict(transformer.config)).items()}
    if vae is not None:
        out.update(vae_to_ldm({k: v.detach() for k, v in vae.state_dict().items()}, dict(vae.config)))
    if dtype is not None:
        out = {k: v.to(dtype) for k, v in out.items()}
    path = Path(out_file)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".partial")
    meta = {"format": "pt", "sd_studio.config": _config_json(transformer)}
    if vae is not None:
        meta["sd_studio.config.vae"] = _config_json(vae)
    save_file({k: v.contiguous() for k, v in out.items()}, str(tmp), metadata={**meta, **(metadata or {})})
    os.replace(tmp, path)
    return path


def _config_json(module) -> str:
    return json.dumps({k: v for k, v in dict(module.config).items() if not k.startswith("_")})


def load_transformer_file(path: str | Path, like):
    """A copy of the SD3Transformer2DModel `like` with the transformer weights of an original-layout file."""
    import copy
    from ..component_files import read_prefixed
    from safetensors import safe_open
    with safe_open(str(path), framework="pt") as f:
        prefixed = any(k.startswith(PREFIX) for k in f.keys())
    model = copy.deepcopy(like)
    model.load_state_dict(from_original(read_prefixed(Path(path), PREFIX if prefixed else "")))
    return model
