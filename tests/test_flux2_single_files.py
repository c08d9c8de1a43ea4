"""Flux.2 from ComfyUI's separate files: the transformer in the original (BFL) layout, the Qwen3 text
encoder with transformers' names, the VAE in the original layout; loaded offline, weight for weight
the model they came from; the original layout agrees with diffusers' own single-file converter on the
full-size architectures; a wrong file is refused naming the option and the key."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from trainer_backend.errors import ConfigError
from trainer_backend.families import get_family, load_model
from trainer_backend.families.flux2.original_keys import export_transformer, to_original, vae_to_original

FLUX2 = get_family("flux2")


def _same(a, b) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.fixture(scope="module")
def comfy_files(tiny_models, tmp_path_factory):
    """The tiny model as ComfyUI keeps Flux.2: three files and a tokenizer folder."""
    folder = tiny_models("flux2")
    model = load_model(str(folder))
    out = tmp_path_factory.mktemp("flux2-files")
    export_transformer(model.denoiser, out / "flux-2-klein-tiny.safetensors")
    te = model.text_encoders[0]
    state = {k: v.contiguous() for k, v in te.state_dict().items() if k != "lm_head.weight"}  # tied: not stored
    save_file(state, str(out / "qwen_3_tiny.safetensors"), metadata={"sd_studio.config": te.config.to_json_string()})
    vae_config = {k: v for k, v in model.vae.config.items() if not k.startswith("_")}
    save_file({k: v.contiguous() for k, v in vae_to_original(model.vae.state_dict(), vae_config).items()},
              str(out / "flux2-vae.safetensors"), metadata={"sd_studio.config": json.dumps(vae_config)})
    return model, folder, out


def test_comfyui_files_load_offline_as_the_model_they_came_from(comfy_files):
    model, folder, out = comfy_files
    loaded = load_model(str(out / "flux-2-klein-tiny.safetensors"), vae=str(out / "flux2-vae.safetensors"),
                        tokenizer=str(folder), text_encoder_files={"text_encoder": str(out / "qwen_3_tiny.safetensors")})
    assert loaded.family is FLUX2 and loaded.vae_scale_factor == model.vae_scale_factor
    assert _same(loaded.denoiser, model.denoiser) and _same(loaded.vae, model.vae)
    assert _same(loaded.text_encoders[0], model.text_encoders[0])
    ids = FLUX2.tokenize(loaded, ["a red square"], 0)
    assert torch.equal(FLUX2.encode_text(loaded, ids)["hidden"], FLUX2.encode_text(model, ids)["hidden"])


def test_a_scaled_fp8_qwen3_file_loads_as_weight_times_scale_and_a_packed_one_is_refused(comfy_files, tmp_path):
    """ComfyUI's fp8 text encoders (qwen_3_8b_fp8mixed): float8 weights with `.weight_scale` (and a
    `.comfy_quant` marker) read as weight × scale; packed (uint8) weights are refused in one line."""
    model, folder, out = comfy_files
    state = {k: v.contiguous() for k, v in model.text_encoders[0].state_dict().items() if k != "lm_head.weight"}
    name = "model.layers.3.mlp.down_proj.weight"
    scale = state[name].abs().max() / 448
    state[name] = (state[name] / scale).to(torch.float8_e4m3fn)
    state[name.replace(".weight", ".weight_scale")] = scale.reshape(())
    state[name.replace(".weight", ".comfy_quant")] = torch.frombuffer(bytearray(b'{"format": "float8_e4m3fn"}'),
                                                                       dtype=torch.uint8)
    meta = {"sd_studio.config": model.text_encoders[0].config.to_json_string()}
    save_file(state, str(tmp_path / "qwen_fp8.safetensors"), metadata=meta)
    options = dict(vae=str(out / "flux2-vae.safetensors"), tokenizer=str(folder))
    loaded = load_model(str(out / "flux-2-klein-tiny.safetensors"), **options,
                        text_encoder_files={"text_encoder": str(tmp_path / "qwen_fp8.safetensors")})
    assert torch.equal(loaded.text_encoders[0].state_dict()[name], state[name].float() * scale)
    state[name] = torch.zeros(state[name].shape, dtype=torch.uint8)
    save_file(state, str(tmp_path / "qwen_packed.safetensors"), metadata=meta)
    with pytest.raises(ConfigError, match=r"^model\.text_encoder: qwen_packed\.safetensors holds packed or integer "
                                          r"weights \(model\.layers\.3\.mlp\.down_proj\.weight is U8\)"):
        load_model(str(out / "flux-2-klein-tiny.safetensors"), **options,
                   text_encoder_files={"text_encoder": str(tmp_path / "qwen_packed.safetensors")})


def test_a_wrong_or_missing_file_is_refused_naming_the_option(comfy_files):
    _, folder, out = comfy_files
    transformer = str(out / "flux-2-klein-tiny.safetensors")
    with pytest.raises(ConfigError, match=r"^model\.text_encoder: a Flux\.2 single file holds no text encoder"):
        load_model(transformer, vae=str(out / "flux2-vae.safetensors"), tokenizer=str(folder))
    with pytest.raises(ConfigError, match=r"^model\.text_encoder: flux2-vae\.safetensors is not a Qwen3"):
        load_model(transformer, vae=str(out / "flux2-vae.safetensors"), tokenizer=str(folder),
                   text_encoder_files={"text_encoder": str(out / "flux2-vae.safetensors")})
    with pytest.raises(ConfigError, match=r"^model\.vae: qwen_3_tiny\.safetensors is not a Flux\.2 autoencoder"):
        load_model(transformer, vae=str(out / "qwen_3_tiny.safetensors"), tokenizer=str(folder),
                   text_encoder_files={"text_encoder": str(out / "qwen_3_tiny.safetensors")})


@pytest.mark.parametrize("size", ["klein-4b", "klein-9b"])
def test_full_size_original_layout_is_what_diffusers_single_file_converter_reads(size):
    from diffusers.loaders.single_file_utils import convert_flux2_transformer_checkpoint_to_diffusers
    from trainer_backend.families.flux2.components import transformer_config
    denoiser = FLUX2.meta_denoiser(size)
    state = denoiser.state_dict()
    original = to_original(state, dict(denoiser.config))
    config = transformer_config({k: tuple(v.shape) for k, v in original.items()}, {})
    assert {k: config[k] for k in ("num_layers", "num_single_layers", "num_attention_heads", "joint_attention_dim")} \
        == {k: denoiser.config[k] for k in ("num_layers", "num_single_layers", "num_attention_heads",
                                            "joint_attention_dim")}
    back = convert_flux2_transformer_checkpoint_to_diffusers(dict(original))
    assert {k: v.shape for k, v in back.items()} == {k: v.shape for k, v in state.items()}


def test_full_size_vae_layout_maps_every_weight_once():
    from diffusers import AutoencoderKLFlux2
    from trainer_backend.families.flux2.components import bundled
    from trainer_backend.families.flux2.original_keys import vae_from_original
    config = bundled("vae.json")
    with torch.device("meta"):
        vae = AutoencoderKLFlux2.from_config(config)
    state = vae.state_dict()
    original = vae_to_original(state, config)
    assert len(original) == len(state)
    assert {"encoder.quant_conv.weight", "decoder.post_quant_conv.weight", "bn.running_mean",
            "encoder.mid.attn_1.q.weight", "decoder.up.3.block.2.conv2.weight"} <= set(original)
    assert vae_from_original(original, state, config).keys() == state.keys()
    moved = {k.replace("encoder.quant_conv", "quant_conv").replace("decoder.post_quant_conv", "post_quant_conv"): v
             for k, v in original.items()}  # the other place ComfyUI accepts them
    assert vae_from_original(moved, state, config).keys() == state.keys()
