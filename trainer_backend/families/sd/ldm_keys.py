"""Diffusers -> original Stable Diffusion (LDM / "single file") state-dict key layout.

diffusers ships only the other direction (original -> diffusers, used by `from_single_file`),
so the export direction is written here, driven by each component's config. It is the
inverse of diffusers' own converters, and the tests check that by loading exported files
back through `from_single_file` and comparing every weight.
"""
from __future__ import annotations

import torch

UNET_PREFIX = "model.diffusion_model."
VAE_PREFIX = "first_stage_model."
# Where each text encoder lives in an original checkpoint, per arch.
CLIP_PREFIX = {"sd1": ["cond_stage_model.transformer.text_model."],
               "sdxl": ["conditioner.embedders.0.transformer.text_model."]}
OPEN_CLIP_PREFIX = {"sd2": "cond_stage_model.model.", "sdxl": "conditioner.embedders.1.model."}

_UNET_TOP = {"time_embedding.linear_1": "time_embed.0", "time_embedding.linear_2": "time_embed.2",
             "conv_in": "input_blocks.0.0", "conv_norm_out": "out.0", "conv_out": "out.2",
             "add_embedding.linear_1": "label_emb.0.0", "add_embedding.linear_2": "label_emb.0.2",
             "class_embedding.linear_1": "label_emb.0.0", "class_embedding.linear_2": "label_emb.0.2"}
_UNET_RESNET = {"norm1": "in_layers.0", "conv1": "in_layers.2", "norm2": "out_layers.0", "conv2": "out_layers.3",
                "time_emb_proj": "emb_layers.1", "conv_shortcut": "skip_connection"}
_VAE_TOP = {"conv_norm_out": "norm_out"}
_VAE_ATTN = {"group_norm": "norm", "to_q": "q", "to_k": "k", "to_v": "v", "to_out.0": "proj_out"}


def _split(key: str, n: int) -> tuple[list[str], str]:
    parts = key.split(".")
    return parts[:n], ".".join(parts[n:])


def _resnet_rest(rest: str, table: dict[str, str]) -> str:
    head, _, tail = rest.partition(".")
    return f"{table.get(head, head)}.{tail}"


def unet_to_ldm(state: dict[str, torch.Tensor], config: dict) -> dict[str, torch.Tensor]:
    """UNet2DConditionModel weights -> `model.diffusion_model.*` keys (input/middle/output_blocks)."""
    per = config["layers_per_block"]
    per = per if isinstance(per, int) else per[0]
    up_has_attn = ["CrossAttn" in t for t in config["up_block_types"]]
    out = {}
    for key, value in state.items():
        new = None
        for src, dst in _UNET_TOP.items():
            if key.startswith(src + "."):
                new = dst + key[len(src):]
        if new is None:
            if key.startswith("down_blocks."):
                (_, b, sub, j), rest = _split(key, 4)
                b, j = int(b), int(j)
                if sub == "resnets":
                    new = f"input_blocks.{1 + b * (per + 1) + j}.0.{_resnet_rest(rest, _UNET_RESNET)}"
                elif sub == "attentions":
                    new = f"input_blocks.{1 + b * (per + 1) + j}.1.{rest}"
                else:  # downsamplers.0.conv.* -> input_blocks.N.0.op.*
                    new = f"input_blocks.{1 + b * (per + 1) + per}.0.op.{rest.split('.', 1)[1]}"
            elif key.startswith("mid_block."):
                (_, sub, j), rest = _split(key, 3)
                if sub == "resnets":
                    new = f"middle_block.{2 * int(j)}.{_resnet_rest(rest, _UNET_RESNET)}"
                else:
                    new = f"middle_block.1.{rest}"
            elif key.startswith("up_blocks."):
                (_, b, sub, j), rest = _split(key, 4)
                b, j = int(b), int(j)
                n_up = per + 1  # the up path has one more layer per block than the down path
                if sub == "resnets":
                    new = f"output_blocks.{b * n_up + j}.0.{_resnet_rest(rest, _UNET_RESNET)}"
                elif sub == "attentions":
                    new = f"output_blocks.{b * n_up + j}.1.{rest}"
                else:  # upsamplers.0.conv.*: after the resnet (and attention, if any) of the last layer
                    slot = 2 if up_has_attn[b] else 1
                    new = f"output_blocks.{b * n_up + n_up - 1}.{slot}.{rest}"
        if new is None:
            raise ValueError(f"unexpected UNet weight {key!r}")
        out[UNET_PREFIX + new] = value
    return out


def vae_to_ldm(state: dict[str, torch.Tensor], config: dict) -> dict[str, torch.Tensor]:
    """AutoencoderKL weights -> `first_stage_model.*` keys (encoder.down.N.block.M, ...)."""
    n_up = len(config["up_block_types"])
    out = {}
    for key, value in state.items():
        side, _, rest = key.partition(".")
        new = None
        if side in ("encoder", "decoder"):
            head, _, tail = rest.partition(".")
            if head in _VAE_TOP:
                new = f"{side}.{_VAE_TOP[head]}.{tail}"
            elif head in ("down_blocks", "up_blocks"):
                (b, sub, j), tail = _split(tail, 3)
                level = b if head == "down_blocks" else str(n_up - 1 - int(b))  # decoder levels are reversed
                name = "down" if head == "down_blocks" else "up"
                if sub == "resnets":
                    new = f"{side}.{name}.{level}.block.{j}.{tail.replace('conv_shortcut', 'nin_shortcut')}"
                else:  # downsamplers.0.conv / upsamplers.0.conv
                    new = f"{side}.{name}.{level}.{'downsample' if name == 'down' else 'upsample'}.{tail}"
            elif head == "mid_block":
                (sub, j), tail = _split(tail, 2)
                if sub == "resnets":
                    new = f"{side}.mid.block_{int(j) + 1}.{tail.replace('conv_shortcut', 'nin_shortcut')}"
                else:
                    for src, dst in _VAE_ATTN.items():
                        if tail.startswith(src + "."):
                            new = f"{side}.mid.attn_1.{dst}{tail[len(src):]}"
                    if value.ndim == 2:  # the original attention uses 1x1 convolutions
                        value = value[:, :, None, None]
            else:
                new = key
        elif side in ("quant_conv", "post_quant_conv"):
            new = key
        if new is None:
            raise ValueError(f"unexpected VAE weight {key!r}")
        out[VAE_PREFIX + new] = value
    return out


def clip_to_ldm(state: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """OpenAI-CLIP layout: the transformers keys under `prefix` (which ends in `text_model.`)."""
    return {prefix + key.removeprefix("text_model."): value for key, value in state.items()
            if not key.endswith("position_ids")}


def open_clip_to_ldm(state: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """OpenCLIP layout (SD2, SDXL's second encoder): fused qkv `in_proj`, `resblocks`, `ln_final`."""
    state = {k.removeprefix("text_model."): v for k, v in state.items() if not k.endswith("position_ids")}
    out: dict[str, torch.Tensor] = {}
    fixed = {"embeddings.token_embedding.weight": "token_embedding.weight",
             "embeddings.position_embedding.weight": "positional_embedding",
             "final_layer_norm.weight": "ln_final.weight", "final_layer_norm.bias": "ln_final.bias"}
    layer_parts = {"layer_norm1": "ln_1", "layer_norm2": "ln_2", "mlp.fc1": "mlp.c_fc", "mlp.fc2": "mlp.c_proj",
                   "self_attn.out_proj": "attn.out_proj"}
    for key, value in state.items():
        if key in fixed:
            out[prefix + fixed[key]] = value
        elif key == "text_projection.weight":
            out[prefix + "text_projection"] = value.T.contiguous()  # OpenCLIP multiplies x @ proj
        elif key.startswith("encoder.layers."):
            (_, _, i), rest = _split(key, 3)
            base = f"{prefix}transformer.resblocks.{i}."
            if rest.startswith("self_attn.q_proj."):
                kind = rest.rsplit(".", 1)[1]  # weight or bias
                qkv = [state[f"encoder.layers.{i}.self_attn.{p}_proj.{kind}"] for p in "qkv"]
                out[base + f"attn.in_proj_{kind}"] = torch.cat(qkv, dim=0)
            elif rest.startswith(("self_attn.k_proj.", "self_attn.v_proj.")):
                continue  # fused into in_proj with q
            else:
                head = next((p for p in layer_parts if rest.startswith(p + ".")), None)
                if head is None:
                    raise ValueError(f"unexpected text encoder weight {key!r}")
                out[base + layer_parts[head] + rest[len(head):]] = value
        else:
            raise ValueError(f"unexpected text encoder weight {key!r}")
    return out


def pipeline_to_ldm(arch: str, unet, vae, text_encoders: list) -> dict[str, torch.Tensor]:
    """All components of an `arch` pipeline -> one original-layout state dict."""
    def sd(module):
        state = module.state_dict()
        if any("lora_" in k or ".base_layer." in k for k in state):
            raise ValueError("the model still has adapter layers; merge them (merge_and_unload) before export")
        return {k: v.detach().contiguous() for k, v in state.items()}

    out = unet_to_ldm(sd(unet), dict(unet.config))
    out.update(vae_to_ldm(sd(vae), dict(vae.config)))
    if arch == "sd1":
        out.update(clip_to_ldm(sd(text_encoders[0]), CLIP_PREFIX["sd1"][0]))
    elif arch == "sd2":
        out.update(open_clip_to_ldm(sd(text_encoders[0]), OPEN_CLIP_PREFIX["sd2"]))
    else:
        out.update(clip_to_ldm(sd(text_encoders[0]), CLIP_PREFIX["sdxl"][0]))
        out.update(open_clip_to_ldm(sd(text_encoders[1]), OPEN_CLIP_PREFIX["sdxl"]))
    return out
