"""Flux.2 weights in the original (Black Forest Labs) layout, the one ComfyUI's diffusion-model and
VAE loaders, kohya-style LoRA names and diffusers' `from_single_file` use.

The transformer: `double_blocks.N.img_attn.qkv` (q, k and v fused), `single_blocks.N.linear1`
(already fused in diffusers too: `attn.to_qkv_mlp_proj`), the shared modulations
`double_stream_modulation_img.lin`, and `final_layer.adaLN_modulation.1` whose (shift, scale) halves
are diffusers' (scale, shift). One table drives both directions; import splits fused weights with the
sizes of the target model, so any size (Klein 4B, 9B, dev, the tiny test model) round-trips.

The autoencoder (`flux2-vae.safetensors`): the LDM layout of families/sd/ldm_keys.py without its
`first_stage_model.` prefix, with the 1x1 convolutions inside the encoder and decoder
(`encoder.quant_conv`, `decoder.post_quant_conv`) and the latent batch-norm statistics (`bn.*`), as
diffusers' scripts/convert_flux2_to_diffusers.py maps them.
"""
from __future__ import annotations

from pathlib import Path

import torch

TOP = [("img_in", ["x_embedder"]), ("txt_in", ["context_embedder"]),
       ("time_in.in_layer", ["time_guidance_embed.timestep_embedder.linear_1"]),
       ("time_in.out_layer", ["time_guidance_embed.timestep_embedder.linear_2"]),
       ("guidance_in.in_layer", ["time_guidance_embed.guidance_embedder.linear_1"]),
       ("guidance_in.out_layer", ["time_guidance_embed.guidance_embedder.linear_2"]),
       ("double_stream_modulation_img.lin", ["double_stream_modulation_img.linear"]),
       ("double_stream_modulation_txt.lin", ["double_stream_modulation_txt.linear"]),
       ("single_stream_modulation.lin", ["single_stream_modulation.linear"]),
       ("final_layer.linear", ["proj_out"])]
DOUBLE = [("img_attn.qkv", ["attn.to_q", "attn.to_k", "attn.to_v"]),
          ("txt_attn.qkv", ["attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj"]),
          ("img_attn.proj", ["attn.to_out.0"]), ("txt_attn.proj", ["attn.to_add_out"]),
          ("img_mlp.0", ["ff.linear_in"]), ("img_mlp.2", ["ff.linear_out"]),
          ("txt_mlp.0", ["ff_context.linear_in"]), ("txt_mlp.2", ["ff_context.linear_out"])]
DOUBLE_NORMS = [("img_attn.norm.query_norm.scale", "attn.norm_q.weight"),
                ("img_attn.norm.key_norm.scale", "attn.norm_k.weight"),
                ("txt_attn.norm.query_norm.scale", "attn.norm_added_q.weight"),
                ("txt_attn.norm.key_norm.scale", "attn.norm_added_k.weight")]
SINGLE = [("linear1", ["attn.to_qkv_mlp_proj"]), ("linear2", ["attn.to_out"])]
SINGLE_NORMS = [("norm.query_norm.scale", "attn.norm_q.weight"), ("norm.key_norm.scale", "attn.norm_k.weight")]
FINAL_NORM = ("final_layer.adaLN_modulation.1", "norm_out.linear")
PREFIXES = ("model.diffusion_model.", "diffusion_model.")


def swap_halves(t: torch.Tensor) -> torch.Tensor:
    a, b = t.chunk(2, dim=0)
    return torch.cat([b, a], dim=0)


def linear_pairs(num_layers: int, num_single_layers: int) -> list[tuple[str, list[str]]]:
    """(original module, [diffusers modules fused into it]) for every linear layer but the final norm's."""
    out = list(TOP)
    for i in range(num_layers):
        out += [(f"double_blocks.{i}.{o}", [f"transformer_blocks.{i}.{d}" for d in ds]) for o, ds in DOUBLE]
    for i in range(num_single_layers):
        out += [(f"single_blocks.{i}.{o}", [f"single_transformer_blocks.{i}.{d}" for d in ds]) for o, ds in SINGLE]
    return out


def _norm_pairs(config: dict) -> list[tuple[str, str]]:
    out = [(f"double_blocks.{i}.{o}", f"transformer_blocks.{i}.{d}")
           for i in range(config["num_layers"]) for o, d in DOUBLE_NORMS]
    return out + [(f"single_blocks.{i}.{o}", f"single_transformer_blocks.{i}.{d}")
                  for i in range(config["num_single_layers"]) for o, d in SINGLE_NORMS]


def to_original(state: dict[str, torch.Tensor], config: dict) -> dict[str, torch.Tensor]:
    """Flux2Transformer2DModel weights -> original-layout weights (every weight, nothing left over)."""
    out: dict[str, torch.Tensor] = {}
    for orig, parts in linear_pairs(config["num_layers"], config["num_single_layers"]):
        for kind in ("weight", "bias"):
            names = [f"{p}.{kind}" for p in parts]
            if all(n in state for n in names):
                out[f"{orig}.{kind}"] = torch.cat([state[n] for n in names], dim=0)
    for orig, name in _norm_pairs(config):
        out[orig] = state[name]
    for kind in ("weight", "bias"):
        if f"{FINAL_NORM[1]}.{kind}" in state:
            out[f"{FINAL_NORM[0]}.{kind}"] = swap_halves(state[f"{FINAL_NORM[1]}.{kind}"])
    return out


def from_original(state: dict[str, torch.Tensor], like: dict[str, torch.Tensor], config: dict) -> dict:
    """Original-layout weights (ComfyUI's `model.diffusion_model.` prefix accepted) -> diffusers names,
    fused weights split with the shapes of `like` (the target model's state dict)."""
    state = strip_prefix(state)
    out: dict[str, torch.Tensor] = {}
    for orig, parts in linear_pairs(config["num_layers"], config["num_single_layers"]):
        for kind in ("weight", "bias"):
            names = [f"{p}.{kind}" for p in parts]
            if f"{orig}.{kind}" in state and all(n in like for n in names):
                sizes = [like[n].shape[0] for n in names]
                out.update(zip(names, torch.split(state[f"{orig}.{kind}"], sizes, dim=0)))
    for orig, name in _norm_pairs(config):
        if orig in state:
            out[name] = state[orig]
    for kind in ("weight", "bias"):
        if f"{FINAL_NORM[0]}.{kind}" in state:
            out[f"{FINAL_NORM[1]}.{kind}"] = swap_halves(state[f"{FINAL_NORM[0]}.{kind}"])
    return out


def strip_prefix(state: dict) -> dict:
    for p in PREFIXES:
        if any(k.startswith(p) for k in state):
            return {k[len(p):]: v for k, v in state.items() if k.startswith(p)}
    return state


def export_transformer(transformer, out_file: str | Path, dtype=None, metadata: dict[str, str] | None = None) -> Path:
    """The transformer alone as an original-layout `.safetensors` file (written atomically), its config
    in the metadata (`sd_studio.config`) so sizes the bundled configs do not know load back too."""
    from ..component_files import save_transformer_file
    return save_transformer_file(transformer, out_file, lambda state: to_original(state, dict(transformer.config)), dtype, metadata)


def load_transformer_file(path: str | Path, like):
    """A copy of the Flux2Transformer2DModel `like` with the weights of an original-layout file."""
    import copy
    from safetensors.torch import load_file
    model = copy.deepcopy(like)
    model.load_state_dict(from_original(load_file(str(path)), model.state_dict(), dict(model.config)))
    return model


# ----------------------------------------------------------------------------- the autoencoder

VAE_MOVED = {"quant_conv": "encoder.quant_conv", "post_quant_conv": "decoder.post_quant_conv"}


def normalise_vae_keys(state: dict) -> dict:
    """The variants of the original VAE layout in circulation -> one: a `first_stage_model.` or `vae.`
    prefix dropped, top-level `quant_conv`/`post_quant_conv` moved into the encoder/decoder (ComfyUI's
    loader accepts both places)."""
    for prefix in ("first_stage_model.", "vae."):
        if any(k.startswith(prefix) for k in state):
            state = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
    if any(k.startswith("encoder.down_blocks.") for k in state):  # diffusers' own layout: left as it is
        return state
    return {(VAE_MOVED[k.split(".", 1)[0]] + "." + k.split(".", 1)[1] if k.split(".", 1)[0] in VAE_MOVED else k): v
            for k, v in state.items()}


def vae_to_original(state: dict[str, torch.Tensor], config: dict) -> dict[str, torch.Tensor]:
    """AutoencoderKLFlux2 weights -> the original layout (flux2-vae.safetensors)."""
    from ..sd.ldm_keys import VAE_PREFIX, vae_to_ldm
    ldm = {k: v for k, v in state.items() if k.startswith(("encoder.", "decoder."))}
    out = {k[len(VAE_PREFIX):]: v for k, v in vae_to_ldm(ldm, config).items()}
    for key, value in state.items():
        head = key.split(".", 1)[0]
        if head in VAE_MOVED:
            out[VAE_MOVED[head] + key[len(head):]] = value
        elif head == "bn":
            out[key] = value
    return out


def vae_from_original(state: dict[str, torch.Tensor], like: dict[str, torch.Tensor], config: dict) -> dict:
    """Original-layout (or already diffusers-layout) VAE weights -> AutoencoderKLFlux2 names, by the
    inverse of vae_to_original on the target model's own keys (`like`); attention 1x1 convolutions
    become linear weights again. Keys the file lacks are left out (the caller checks)."""
    state = normalise_vae_keys(state)
    if any(k.startswith("encoder.down_blocks.") for k in state):
        return {k: v for k, v in state.items() if k in like}
    names = {next(iter(vae_to_original({key: value}, config))): key for key, value in like.items()}
    out = {}
    for orig, key in names.items():
        if orig in state:
            out[key] = state[orig].reshape(like[key].shape)
    return out
