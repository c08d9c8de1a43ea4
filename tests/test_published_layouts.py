"""The file layouts this project reads and writes for ComfyUI's separate files (Krea 2, Qwen-Image 2.1, Ideogram 4:
transformer, Qwen3-VL text encoder, Qwen-Image 2.1's VAE), checked on the full-size architectures (meta device)
against what the published loaders say about the published files. The real files cannot be downloaded here, so
the expected names and shapes are written out below from published facts, not derived from our converters:

- ComfyUI's module trees, whose `state_dict` names are the files' keys (Comfy-Org/ComfyUI: comfy/ldm/krea2/model.py,
  comfy/ldm/qwen_image21/model.py, comfy/ldm/ideogram4/model.py with comfy/ldm/lumina/model.py's FeedForward,
  comfy/ldm/wan/vae2_2.py + vae.py built with the configs comfy/sd.py gives Qwen-Image 2.1's VAE and a Wan
  2.1-layout VAE (Krea 2's, Qwen-Image's), comfy/ldm/modules/diffusionmodules/model.py's Encoder/Decoder for
  FLUX.2's VAE (Ideogram 4's), comfy/text_encoders/qwen3vl.py with llama.py's Llama2_ and qwen35.py's vision
  tower), at their default sizes;
- ComfyUI's detection (comfy/model_detection.py: the keys each model is recognised by and the config it reads off
  the shapes; comfy/sd.py for the VAE) and diffusers' (single_file_utils.CHECKPOINT_KEY_NAMES);
- published header listings: Krea 2's fp8 diffusion model has 430 tensors, Ideogram 4's 458.
docs/models.md, "Checked against the published layouts", lists them."""
from __future__ import annotations

import pytest
import torch

from trainer_backend.families.component_files import bundled, weights_on_meta


def _shapes(state: dict) -> dict:
    return {k: tuple(v.shape) for k, v in state.items()}


def _same_layout(ours: dict, published: dict) -> None:
    """Key for key, shape for shape; a difference names the first keys on either side."""
    missing, extra = sorted(published.keys() - ours.keys()), sorted(ours.keys() - published.keys())
    assert not missing and not extra, f"missing {missing[:5]}, not published {extra[:5]}"
    wrong = [(k, ours[k], published[k]) for k in published if tuple(ours[k]) != tuple(published[k])]
    assert not wrong, wrong[:5]


def _count(keys, prefix: str) -> int:
    """ComfyUI's count_blocks: how many `prefix{i}.` indices exist from 0 on."""
    n = 0
    while any(k.startswith(f"{prefix}{n}.") for k in keys):
        n += 1
    return n


# ------------------------------------------------------------------------------------------- Krea 2
def krea2_published(features=6144, tdim=256, txtdim=2560, heads=48, kvheads=12, multiplier=4, layers=28, patch=2,
                    channels=16, txtlayers=12, txtheads=20, txtkvheads=20) -> dict:
    """comfy/ldm/krea2/model.py SingleStreamDiT (its defaults are the published model): bias-free blocks."""
    def swiglu(dim):
        hidden = int(2 * dim / 3) * multiplier
        return 128 * ((hidden + 127) // 128)

    def block(p, dim, h, kvh, modulation):
        hd, m = dim // h, swiglu(dim)
        out = {f"{p}prenorm.scale": (dim,), f"{p}postnorm.scale": (dim,), f"{p}attn.wq.weight": (hd * h, dim),
               f"{p}attn.wk.weight": (hd * kvh, dim), f"{p}attn.wv.weight": (hd * kvh, dim),
               f"{p}attn.gate.weight": (dim, dim), f"{p}attn.qknorm.qnorm.scale": (hd,),
               f"{p}attn.qknorm.knorm.scale": (hd,), f"{p}attn.wo.weight": (dim, dim),
               f"{p}mlp.gate.weight": (m, dim), f"{p}mlp.up.weight": (m, dim), f"{p}mlp.down.weight": (dim, m)}
        return {**out, f"{p}mod.lin": (6 * dim,)} if modulation else out

    out = {"first.weight": (features, channels * patch ** 2), "first.bias": (features,),
           "tmlp.0.weight": (features, tdim), "tmlp.0.bias": (features,), "tmlp.2.weight": (features, features),
           "tmlp.2.bias": (features,), "txtfusion.projector.weight": (1, txtlayers), "txtmlp.0.scale": (txtdim,),
           "txtmlp.1.weight": (features, txtdim), "txtmlp.1.bias": (features,), "txtmlp.3.weight": (features, features),
           "txtmlp.3.bias": (features,), "last.norm.scale": (features,),
           "last.linear.weight": (patch * patch * channels, features), "last.linear.bias": (patch * patch * channels,),
           "last.modulation.lin": (2, features), "tproj.1.weight": (6 * features, features),
           "tproj.1.bias": (6 * features,)}
    for kind in ("layerwise_blocks", "refiner_blocks"):
        for i in range(2):
            out.update(block(f"txtfusion.{kind}.{i}.", txtdim, txtheads, txtkvheads, False))
    for i in range(layers):
        out.update(block(f"blocks.{i}.", features, heads, kvheads, True))
    return out


def test_krea2_transformer_file_is_the_published_layout():
    from diffusers import Krea2Transformer2DModel
    from diffusers.loaders.single_file_utils import CHECKPOINT_KEY_NAMES
    from trainer_backend.families.krea2.single_file import to_original
    with weights_on_meta():
        model = Krea2Transformer2DModel.from_config(bundled("krea2", "transformer/config.json"))
    ours = _shapes(to_original(model.state_dict()))
    _same_layout(ours, krea2_published())
    assert len(ours) == 430  # the published fp8 file's tensor count
    assert any(k in ours for k in CHECKPOINT_KEY_NAMES["krea2"])  # diffusers' detection key
    # what ComfyUI's model_detection reads off the shapes equals its model's defaults
    head = 128
    assert (ours["first.weight"][0], ours["first.weight"][1] // 4, _count(ours, "blocks."),
            ours["blocks.0.attn.wq.weight"][0] // head, ours["blocks.0.attn.wk.weight"][0] // head,
            ours["txtfusion.projector.weight"][1], ours["txtfusion.layerwise_blocks.0.prenorm.scale"][0]) == \
        (6144, 16, 28, 48, 12, 12, 2560)


# ----------------------------------------------------------------------------------- Qwen-Image 2.1
def qwen_image21_published(in_channels=64, out_channels=64, layers=32, head_dim=128, heads=32, context=4096,
                           mlp_ratio=3) -> dict:
    """comfy/ldm/qwen_image21/model.py with fused_mlp (a ComfyUI-saved file: gate rows then up rows in gate_up);
    every Linear bias-free, the LayerNorms without weights, TimestepEmbedding without biases."""
    inner = heads * head_dim
    out = {"time_text_embed.timestep_embedder.linear_1.weight": (inner, 256),
           "time_text_embed.timestep_embedder.linear_2.weight": (inner, inner), "txt_in.text_norm.weight": (context,),
           "txt_in.in_layer.weight": (inner, context), "txt_in.out_layer.weight": (inner, inner),
           "img_in.weight": (inner, in_channels), "modulation.1.weight": (4 * inner, inner),
           "norm_out.linear.weight": (inner, inner), "proj_out.weight": (out_channels, inner)}
    for i in range(layers):
        p = f"transformer_blocks.{i}."
        out.update({f"{p}attn.{n}.weight": (inner, inner) for n in ("to_q", "to_k", "to_v", "to_out.0")})
        out.update({f"{p}attn.norm_q.weight": (head_dim,), f"{p}attn.norm_k.weight": (head_dim,),
                    f"{p}img_mlp.gate_up.weight": (2 * inner * mlp_ratio, inner),
                    f"{p}img_mlp.out.weight": (inner, inner * mlp_ratio)})
    return out


def test_qwen_image21_transformer_file_is_the_published_layout():
    from diffusers import QwenImage21Transformer2DModel
    from diffusers.loaders.single_file_utils import CHECKPOINT_KEY_NAMES
    from trainer_backend.families.qwen_image21.single_file import to_original
    with weights_on_meta():
        model = QwenImage21Transformer2DModel.from_config(bundled("qwen_image21", "transformer/config.json"))
    ours = _shapes(to_original(model.state_dict()))
    _same_layout(ours, qwen_image21_published())
    assert any(k in ours for k in CHECKPOINT_KEY_NAMES["qwen-image-2.1"])
    detected_by = ["txt_in.text_norm.weight", "modulation.1.weight", "transformer_blocks.0.attn.norm_q.weight",
                   "img_in.weight", "proj_out.weight", "transformer_blocks.0.img_mlp.gate_up.weight"]
    assert all(k in ours for k in detected_by)
    head, inner = ours["transformer_blocks.0.attn.norm_q.weight"][0], ours["img_in.weight"][0]
    assert (head, inner // head, ours["img_in.weight"][1], ours["proj_out.weight"][0], _count(ours, "transformer_blocks."),
            ours["txt_in.text_norm.weight"][0], ours["transformer_blocks.0.img_mlp.gate_up.weight"][0] // 2 // inner) \
        == (128, 32, 64, 64, 32, 4096, 3)
    # and the detectors that model_detection runs before Qwen-Image 2.1's do not claim it
    assert "txt_norm.weight" not in ours and "embed_image_indicator.weight" not in ours


# ------------------------------------------------------------------------------------------ Ideogram 4
def ideogram4_published(in_channels=128, layers=34, heads=18, head_dim=256, intermediate=12288, adaln=512,
                        llm=53248) -> dict:
    """comfy/ldm/ideogram4/model.py (Lumina's FeedForward: w1/w2/w3 bias-free, multiple_of=1)."""
    emb = heads * head_dim
    out = {"input_proj.weight": (emb, in_channels), "input_proj.bias": (emb,), "llm_cond_norm.weight": (llm,),
           "llm_cond_proj.weight": (emb, llm), "llm_cond_proj.bias": (emb,), "t_embedding.mlp_in.weight": (emb, emb),
           "t_embedding.mlp_in.bias": (emb,), "t_embedding.mlp_out.weight": (emb, emb), "t_embedding.mlp_out.bias": (emb,),
           "adaln_proj.weight": (adaln, emb), "adaln_proj.bias": (adaln,), "embed_image_indicator.weight": (2, emb),
           "final_layer.linear.weight": (in_channels, emb), "final_layer.linear.bias": (in_channels,),
           "final_layer.adaln_modulation.weight": (emb, adaln), "final_layer.adaln_modulation.bias": (emb,)}
    for i in range(layers):
        p = f"layers.{i}."
        out.update({f"{p}attention.qkv.weight": (3 * emb, emb), f"{p}attention.norm_q.weight": (head_dim,),
                    f"{p}attention.norm_k.weight": (head_dim,), f"{p}attention.o.weight": (emb, emb),
                    f"{p}feed_forward.w1.weight": (intermediate, emb), f"{p}feed_forward.w2.weight": (emb, intermediate),
                    f"{p}feed_forward.w3.weight": (intermediate, emb), f"{p}adaln_modulation.weight": (4 * emb, adaln),
                    f"{p}adaln_modulation.bias": (4 * emb,)})
        out.update({f"{p}{n}.weight": (emb,) for n in ("attention_norm1", "ffn_norm1", "attention_norm2", "ffn_norm2")})
    return out


def test_ideogram4_transformer_file_is_the_published_layout():
    from diffusers import Ideogram4Transformer2DModel
    from trainer_backend.families.ideogram4.original_file import to_original
    with weights_on_meta():
        model = Ideogram4Transformer2DModel.from_config(bundled("ideogram4", "transformer.json"))
    ours = _shapes(to_original(model.state_dict()))
    _same_layout(ours, ideogram4_published())
    assert len(ours) == 458  # the published fp8 file's tensor count
    assert "embed_image_indicator.weight" in ours  # ComfyUI's detection key
    assert (ours["input_proj.weight"][1], _count(ours, "layers.")) == (128, 34)
    assert not any(k.startswith(("txt_in.", "txtfusion.")) for k in ours)  # not claimed as Qwen-Image 2.1 / Krea 2


# -------------------------------------------------------------------------------- Qwen-Image 2.1's VAE
def qwen_image21_vae_published(dim=96, dec_dim=144, z=64, mult=(1, 2, 4, 8, 8), res_blocks=2,
                               temporal_down=(False, True, True, True), channels=4, tk=1) -> dict:
    """comfy/ldm/wan/vae2_2.py WanVAE as comfy/sd.py builds it for this VAE (temporal kernel 1, patch 1, RGBA):
    causal convolutions 5-D, the resamples' and the attention's convolutions 2-D."""
    out = {}

    def conv(p, i, o, kernel):
        out[f"{p}.weight"], out[f"{p}.bias"] = (o, i, *kernel), (o,)

    def rms(p, d, images=False):
        out[f"{p}.gamma"] = (d, 1, 1) if images else (d, 1, 1, 1)

    def residual(p, i, o):
        rms(f"{p}.residual.0", i)
        conv(f"{p}.residual.2", i, o, (tk, 3, 3))
        rms(f"{p}.residual.3", o)
        conv(f"{p}.residual.6", o, o, (tk, 3, 3))
        if i != o:
            conv(f"{p}.shortcut", i, o, (1, 1, 1))

    def middle(p, d):
        residual(f"{p}.middle.0", d, d)
        rms(f"{p}.middle.1.norm", d, images=True)
        conv(f"{p}.middle.1.to_qkv", d, 3 * d, (1, 1))
        conv(f"{p}.middle.1.proj", d, d, (1, 1))
        residual(f"{p}.middle.2", d, d)

    def resample(p, d, mode):
        conv(f"{p}.resample.1", d, d, (3, 3))
        if mode.endswith("3d"):
            conv(f"{p}.time_conv", d, 2 * d if mode.startswith("up") else d, (tk, 1, 1))

    dims = [dim * m for m in (1, *mult)]
    conv("encoder.conv1", channels, dims[0], (tk, 3, 3))
    for i, (a, b) in enumerate(zip(dims[:-1], dims[1:])):
        for j in range(res_blocks):
            residual(f"encoder.downsamples.{i}.downsamples.{j}", a if j == 0 else b, b)
        if i != len(mult) - 1:
            resample(f"encoder.downsamples.{i}.downsamples.{res_blocks}", b,
                     "downsample3d" if i < len(temporal_down) and temporal_down[i] else "downsample2d")
    middle("encoder", dims[-1])
    rms("encoder.head.0", dims[-1])
    conv("encoder.head.2", dims[-1], 2 * z, (tk, 3, 3))
    conv("conv1", 2 * z, 2 * z, (1, 1, 1))
    conv("conv2", z, z, (1, 1, 1))
    dims = [dec_dim * m for m in (mult[-1], *mult[::-1])]
    temporal_up = temporal_down[::-1]
    conv("decoder.conv1", z, dims[0], (tk, 3, 3))
    middle("decoder", dims[0])
    for i, (a, b) in enumerate(zip(dims[:-1], dims[1:])):
        for j in range(res_blocks + 1):
            residual(f"decoder.upsamples.{i}.upsamples.{j}", a if j == 0 else b, b)
        if i != len(mult) - 1:
            resample(f"decoder.upsamples.{i}.upsamples.{res_blocks + 1}", b,
                     "upsample3d" if i < len(temporal_up) and temporal_up[i] else "upsample2d")
    rms("decoder.head.0", dims[-1])
    conv("decoder.head.2", dims[-1], channels, (tk, 3, 3))
    return out


def test_qwen_image21_vae_file_is_the_published_layout():
    from diffusers import AutoencoderKLQwenImage21
    from trainer_backend.families.qwen_image21.components import vae_from_original_one, vae_to_original
    with weights_on_meta():
        vae = AutoencoderKLQwenImage21.from_config(bundled("qwen_image21", "vae/config.json"))
    state = vae.state_dict()
    original = vae_to_original(state)
    ours = _shapes(original)
    _same_layout(ours, qwen_image21_vae_published())
    # comfy/sd.py recognises it as Qwen-Image 2.1's VAE and reads its config off these shapes
    head = ours["decoder.head.2.weight"]
    assert "decoder.middle.0.residual.0.gamma" in ours and "decoder.upsamples.0.upsamples.0.residual.2.weight" in ours
    assert len(head) == 5 and head[2] == 1 and head[0] == 4
    assert (ours["encoder.conv1.weight"][0], ours["decoder.head.0.gamma"][0], ours["decoder.conv1.weight"][1]) == \
        (96, 144, 64)
    # and the file's names and shapes map back onto diffusers' model tensor for tensor
    back = {}
    for name, tensor in original.items():
        back.update(vae_from_original_one(name, tensor))
    assert _shapes(back) == _shapes(state)


# ------------------------------------------ Krea 2's VAE (Qwen-Image's, Wan 2.1 layout) and Ideogram 4's (FLUX.2's)
def wan21_vae_published(dim=96, z=16, mult=(1, 2, 4, 4), res_blocks=2, temporal_down=(False, True, True),
                        channels=3) -> dict:
    """comfy/ldm/wan/vae.py WanVAE with the config comfy/sd.py gives a Wan 2.1-layout file: one flat `downsamples`
    / `upsamples` sequence per side, 3-frame causal convolutions, the decoder's upsamples halving the width."""
    out = {}

    def conv(p, i, o, kernel):
        out[f"{p}.weight"], out[f"{p}.bias"] = (o, i, *kernel), (o,)

    def residual(p, i, o):
        out[f"{p}.residual.0.gamma"], out[f"{p}.residual.3.gamma"] = (i, 1, 1, 1), (o, 1, 1, 1)
        conv(f"{p}.residual.2", i, o, (3, 3, 3))
        conv(f"{p}.residual.6", o, o, (3, 3, 3))
        if i != o:
            conv(f"{p}.shortcut", i, o, (1, 1, 1))

    def middle(p, d):
        residual(f"{p}.middle.0", d, d)
        out[f"{p}.middle.1.norm.gamma"] = (d, 1, 1)
        conv(f"{p}.middle.1.to_qkv", d, 3 * d, (1, 1))
        conv(f"{p}.middle.1.proj", d, d, (1, 1))
        residual(f"{p}.middle.2", d, d)

    dims, n = [dim * m for m in (1, *mult)], 0
    conv("encoder.conv1", channels, dims[0], (3, 3, 3))
    for i, (a, b) in enumerate(zip(dims[:-1], dims[1:])):
        for _ in range(res_blocks):
            residual(f"encoder.downsamples.{n}", a, b)
            a, n = b, n + 1
        if i != len(mult) - 1:
            conv(f"encoder.downsamples.{n}.resample.1", b, b, (3, 3))
            if temporal_down[i]:
                conv(f"encoder.downsamples.{n}.time_conv", b, b, (3, 1, 1))
            n += 1
    middle("encoder", dims[-1])
    out["encoder.head.0.gamma"] = (dims[-1], 1, 1, 1)
    conv("encoder.head.2", dims[-1], 2 * z, (3, 3, 3))
    conv("conv1", 2 * z, 2 * z, (1, 1, 1))
    conv("conv2", z, z, (1, 1, 1))
    dims, n, temporal_up = [dim * m for m in (mult[-1], *mult[::-1])], 0, temporal_down[::-1]
    conv("decoder.conv1", z, dims[0], (3, 3, 3))
    middle("decoder", dims[0])
    for i, (a, b) in enumerate(zip(dims[:-1], dims[1:])):
        a = a // 2 if i in (1, 2, 3) else a
        for _ in range(res_blocks + 1):
            residual(f"decoder.upsamples.{n}", a, b)
            a, n = b, n + 1
        if i != len(mult) - 1:
            conv(f"decoder.upsamples.{n}.resample.1", b, b // 2, (3, 3))
            if temporal_up[i]:
                conv(f"decoder.upsamples.{n}.time_conv", b, 2 * b, (3, 1, 1))
            n += 1
    out["decoder.head.0.gamma"] = (dims[-1], 1, 1, 1)
    conv("decoder.head.2", dims[-1], channels, (3, 3, 3))
    return out


def test_krea2_vae_file_in_the_published_wan21_layout_reads_onto_qwen_images_autoencoder():
    """Krea 2 decodes with Qwen-Image's autoencoder; its ComfyUI file (qwen_image_vae.safetensors) is in Wan 2.1's
    layout, read through diffusers' convert_wan_vae_to_diffusers (qwen_image/single_file.vae_state)."""
    from diffusers import AutoencoderKLQwenImage
    from trainer_backend.families.qwen_image.single_file import vae_state
    published = wan21_vae_published()
    assert (published["encoder.conv1.weight"], published["decoder.conv1.weight"], published["decoder.head.2.weight"],
            published["conv1.weight"]) == ((96, 3, 3, 3, 3), (384, 16, 3, 3, 3), (3, 96, 3, 3, 3), (32, 32, 1, 1, 1))
    assert "decoder.middle.0.residual.0.gamma" in published  # ComfyUI's and diffusers' ("wan_vae") detection key
    with weights_on_meta():
        vae = AutoencoderKLQwenImage.from_config(bundled("qwen_image", "vae/config.json"))
    read = vae_state({k: torch.empty(v, device="meta") for k, v in published.items()})
    _same_layout(_shapes(read), _shapes(vae.state_dict()))


def ldm_vae_published(ch=128, mult=(1, 2, 4, 4), res_blocks=2, z=32, channels=3) -> dict:
    """comfy/ldm/modules/diffusionmodules/model.py's Encoder/Decoder (AutoencoderKL, double_z) as comfy/sd.py
    builds it for a `decoder.conv_in.weight` file; FLUX.2's file keeps `encoder.quant_conv` and
    `decoder.post_quant_conv` (sd.py moves them) and the latent batch norm's statistics (`bn.running_*`, 4z
    channels after the 2x2 patchify)."""
    out = {}

    def conv(p, i, o, k):
        out[f"{p}.weight"], out[f"{p}.bias"] = (o, i, k, k), (o,)

    def norm(p, c):
        out[f"{p}.weight"] = out[f"{p}.bias"] = (c,)

    def resnet(p, i, o):
        norm(f"{p}.norm1", i)
        conv(f"{p}.conv1", i, o, 3)
        norm(f"{p}.norm2", o)
        conv(f"{p}.conv2", o, o, 3)
        if i != o:
            conv(f"{p}.nin_shortcut", i, o, 1)

    def mid(p, c):
        resnet(f"{p}.mid.block_1", c, c)
        norm(f"{p}.mid.attn_1.norm", c)
        for n in ("q", "k", "v", "proj_out"):
            conv(f"{p}.mid.attn_1.{n}", c, c, 1)
        resnet(f"{p}.mid.block_2", c, c)

    conv("encoder.conv_in", channels, ch, 3)
    block_in = ch
    for level, m in enumerate(mult):
        for j in range(res_blocks):
            resnet(f"encoder.down.{level}.block.{j}", block_in, ch * m)
            block_in = ch * m
        if level != len(mult) - 1:
            conv(f"encoder.down.{level}.downsample.conv", block_in, block_in, 3)
    mid("encoder", block_in)
    norm("encoder.norm_out", block_in)
    conv("encoder.conv_out", block_in, 2 * z, 3)
    block_in = ch * mult[-1]
    conv("decoder.conv_in", z, block_in, 3)
    mid("decoder", block_in)
    for level in reversed(range(len(mult))):
        for j in range(res_blocks + 1):
            resnet(f"decoder.up.{level}.block.{j}", block_in, ch * mult[level])
            block_in = ch * mult[level]
        if level != 0:
            conv(f"decoder.up.{level}.upsample.conv", block_in, block_in, 3)
    norm("decoder.norm_out", block_in)
    conv("decoder.conv_out", block_in, channels, 3)
    conv("encoder.quant_conv", 2 * z, 2 * z, 1)
    conv("decoder.post_quant_conv", z, z, 1)
    out["bn.running_mean"] = out["bn.running_var"] = (4 * z,)
    return out


def test_ideogram4_vae_file_is_the_published_flux2_layout():
    """Ideogram 4 decodes with FLUX.2's autoencoder (flux2-vae.safetensors), read through flux2/original_keys."""
    from diffusers import AutoencoderKLFlux2
    from trainer_backend.families.flux2.original_keys import vae_to_original
    config = bundled("flux2", "vae.json")
    with weights_on_meta():
        vae = AutoencoderKLFlux2.from_config(config)
    state = {k: v for k, v in vae.state_dict().items() if not k.endswith("num_batches_tracked")}
    _same_layout(_shapes(vae_to_original(state, config)), ldm_vae_published())


# ------------------------------------------------------------------------------ Qwen3-VL text encoders
def qwen3vl_published(vocab, hidden, layers, heads, kv_heads, head_dim, intermediate, vision: dict) -> dict:
    """comfy/text_encoders/qwen3vl.py: `model` = llama.py's Llama2_ (q/k norms, no biases, final norm), `visual` =
    qwen35.py's vision tower + DeepStack mergers (QWEN3VL_VISION sizes, out_hidden_size = the text width)."""
    out = {"model.embed_tokens.weight": (vocab, hidden), "model.norm.weight": (hidden,)}
    for i in range(layers):
        p = f"model.layers.{i}."
        out.update({f"{p}self_attn.q_proj.weight": (heads * head_dim, hidden),
                    f"{p}self_attn.k_proj.weight": (kv_heads * head_dim, hidden),
                    f"{p}self_attn.v_proj.weight": (kv_heads * head_dim, hidden),
                    f"{p}self_attn.o_proj.weight": (hidden, heads * head_dim), f"{p}self_attn.q_norm.weight": (head_dim,),
                    f"{p}self_attn.k_norm.weight": (head_dim,), f"{p}mlp.gate_proj.weight": (intermediate, hidden),
                    f"{p}mlp.up_proj.weight": (intermediate, hidden), f"{p}mlp.down_proj.weight": (hidden, intermediate),
                    f"{p}input_layernorm.weight": (hidden,), f"{p}post_attention_layernorm.weight": (hidden,)})
    v, inter, merged = vision["hidden_size"], vision["intermediate_size"], vision["hidden_size"] * 4  # merge 2x2
    out.update({"visual.patch_embed.proj.weight": (v, 3, 2, 16, 16), "visual.patch_embed.proj.bias": (v,),
                "visual.pos_embed.weight": (2304, v)})

    def linear(p, i, o):
        out[f"{p}.weight"], out[f"{p}.bias"] = (o, i), (o,)

    for i in range(vision["depth"]):
        p = f"visual.blocks.{i}."
        for n in ("norm1", "norm2"):
            out[f"{p}{n}.weight"] = out[f"{p}{n}.bias"] = (v,)
        linear(f"{p}attn.qkv", v, 3 * v)
        linear(f"{p}attn.proj", v, v)
        linear(f"{p}mlp.linear_fc1", v, inter)
        linear(f"{p}mlp.linear_fc2", inter, v)
    out["visual.merger.norm.weight"] = out["visual.merger.norm.bias"] = (v,)
    linear("visual.merger.linear_fc1", merged, merged)
    linear("visual.merger.linear_fc2", merged, hidden)
    for i in range(len(vision["deepstack_visual_indexes"])):
        p = f"visual.deepstack_merger_list.{i}"
        out[f"{p}.norm.weight"] = out[f"{p}.norm.bias"] = (merged,)  # DeepStack: norm after the 2x2 merge
        linear(f"{p}.linear_fc1", merged, merged)
        linear(f"{p}.linear_fc2", merged, hidden)
    return out


QWEN3VL_VISION = {"4b": dict(hidden_size=1024, intermediate_size=4096, depth=24, deepstack_visual_indexes=[5, 11, 17]),
                  "8b": dict(hidden_size=1152, intermediate_size=4304, depth=27, deepstack_visual_indexes=[8, 16, 24])}


@pytest.mark.parametrize("family,config,size", [("qwen_image21", "text_encoder/config.json", "8b"),
                                                ("ideogram4", "text_encoder.json", "8b"),
                                                ("krea2", "text_encoder/config.json", "4b")])
def test_qwen3vl_text_encoder_file_names_are_comfyuis(family, config, size):
    from transformers import Qwen3VLConfig, Qwen3VLModel
    from trainer_backend.families.qwen3vl_file import comfy_name, hf_name
    cfg = Qwen3VLConfig(**bundled(family, config))
    with weights_on_meta():
        model = Qwen3VLModel(cfg)
    state = model.state_dict()
    ours = {comfy_name(k): tuple(v.shape) for k, v in state.items()}
    t = cfg.text_config
    _same_layout(ours, qwen3vl_published(t.vocab_size, t.hidden_size, t.num_hidden_layers, t.num_attention_heads,
                                         t.num_key_value_heads, t.head_dim, t.intermediate_size, QWEN3VL_VISION[size]))
    # ComfyUI's prefix in a checkpoint-style file reads back to the same names
    assert {hf_name(f"text_encoders.qwen3vl_{size}.transformer.{k}", False) for k in ours} == set(state)
    assert (t.hidden_size, t.num_hidden_layers) == {"8b": (4096, 36), "4b": (2560, 36)}[size]
    assert torch.Size(ours["visual.merger.linear_fc2.weight"])[0] == t.hidden_size
