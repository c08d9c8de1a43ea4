"""Flux.2 dev from ComfyUI's separate files: the transformer in the original (BFL) layout, the Mistral
Small 3 text encoder as ComfyUI stores it (`model.layers.*`, `vision_tower.*`, the Tekken tokenizer
bytes, no lm_head; bf16 or scaled fp8) and the VAE, loaded through the config options a user sets, give
the folder-loaded model's text embeddings and transformer output exactly; wrong files are refused in
one line naming the option and the file; the full-size dev layouts map every weight."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from trainer_backend.config import load_config
from trainer_backend.errors import ConfigError
from trainer_backend.families import get_family, load_configured, load_model
from trainer_backend.families.flux2.mistral_file import to_comfyui_layout, to_transformers_name
from trainer_backend.families.flux2.original_keys import export_transformer, vae_to_original

FLUX2 = get_family("flux2")


def _comfy_text_encoder(te, out, fp8=False, vision=True, config=True):
    state = {k: v.contiguous() for k, v in to_comfyui_layout(te.state_dict()).items()
             if vision or k.startswith("model.")}
    state["tekken_model"] = torch.frombuffer(bytearray(b'{"vocab": []}'), dtype=torch.uint8)  # as ComfyUI's file
    if fp8:  # ComfyUI's scaled fp8: float8 weight, fp32 scale, the format marker
        for name in [k for k in state if k.endswith("_proj.weight")]:
            scale = state[name].abs().max() / 448
            state[name] = (state[name] / scale).to(torch.float8_e4m3fn)
            state[name[: -len("weight")] + "weight_scale"] = scale.reshape(())
            state[name[: -len("weight")] + "comfy_quant"] = torch.frombuffer(
                bytearray(b'{"format": "float8_e4m3fn"}'), dtype=torch.uint8)
    metadata = {"sd_studio.config": te.config.to_json_string()} if config else {}
    save_file(state, str(out), metadata=metadata)
    return out


@pytest.fixture(scope="module")
def dev_files(tiny_models, tmp_path_factory):
    """The tiny dev model as ComfyUI keeps Flux.2 dev: three files, and its folder for the tokenizer."""
    folder = tiny_models("flux2-dev")
    model = load_model(str(folder))
    out = tmp_path_factory.mktemp("flux2-dev-files")
    export_transformer(model.denoiser, out / "flux2-dev.safetensors")
    _comfy_text_encoder(model.text_encoders[0], out / "mistral_3_small_flux2_bf16.safetensors")
    vae_config = {k: v for k, v in model.vae.config.items() if not k.startswith("_")}
    save_file({k: v.contiguous() for k, v in vae_to_original(model.vae.state_dict(), vae_config).items()},
              str(out / "flux2-vae.safetensors"), metadata={"sd_studio.config": json.dumps(vae_config)})
    return model, folder, out


def _configured(folder, out, text_encoder="mistral_3_small_flux2_bf16.safetensors"):
    cfg = load_config(None, [f"model.path={out / 'flux2-dev.safetensors'}", f"model.vae={out / 'flux2-vae.safetensors'}",
                             f"model.text_encoder={out / text_encoder}", f"model.tokenizer={folder}"])
    return load_configured(cfg.model)


def _outputs(model):
    """The text embeddings of a caption and the transformer's prediction on them (guidance 4)."""
    torch.manual_seed(0)
    ids = FLUX2.tokenize(model, ["a red square"], 0)
    hidden = FLUX2.encode_text(model, ids)
    noisy = torch.randn(1, 32, 4, 4)
    cfg = load_config(None, ["model.guidance=4.0"])
    with torch.no_grad():
        out = FLUX2.predict(model, model.denoiser, noisy, torch.tensor([500.0]), hidden, {}, torch.float32, cfg)
    return hidden["hidden"], out


def test_comfyui_dev_files_load_through_the_options_as_the_folder_model(dev_files):
    model, folder, out = dev_files
    loaded = _configured(folder, out)
    assert loaded.family is FLUX2 and FLUX2.architecture(loaded) == "flux.2-dev"
    assert type(loaded.text_encoders[0]).__name__ == "Mistral3ForConditionalGeneration"
    assert loaded.denoiser.config.guidance_embeds
    (hidden_a, out_a), (hidden_b, out_b) = _outputs(loaded), _outputs(model)
    assert torch.equal(hidden_a, hidden_b) and torch.equal(out_a, out_b)
    ours = loaded.text_encoders[0].state_dict()
    assert all(torch.equal(v, ours[k]) for k, v in model.text_encoders[0].state_dict().items()
               if k != "lm_head.weight")  # ComfyUI's file has no lm_head: tied (logits are never computed)


def test_fp8_and_text_only_files_give_the_same_embeddings_up_to_fp8_rounding(dev_files):
    """The fp8 file's weights are weight × scale; a file without the vision tower still encodes text."""
    model, folder, out = dev_files
    te = model.text_encoders[0]
    _comfy_text_encoder(te, out / "mistral_fp8.safetensors", fp8=True)
    _comfy_text_encoder(te, out / "mistral_text_only.safetensors", vision=False)
    reference, _ = _outputs(model)
    loaded = _configured(folder, out, "mistral_fp8.safetensors")
    name = "model.language_model.layers.5.mlp.down_proj.weight"
    weight = te.state_dict()[name]
    scale = weight.abs().max() / 448
    assert torch.equal(loaded.text_encoders[0].state_dict()[name], (weight / scale).to(torch.float8_e4m3fn).float() * scale)
    fp8, _ = _outputs(loaded)
    error = ((fp8 - reference).norm() / reference.norm()).item()
    assert 0 < error < 0.2, error  # e4m3's 3 mantissa bits through 30 layers; without the scale it is all wrong
    text_only = _configured(folder, out, "mistral_text_only.safetensors")
    assert torch.equal(_outputs(text_only)[0], reference)
    assert all(not p.any() for p in text_only.text_encoders[0].model.vision_tower.parameters())


def test_a_wrong_or_missing_dev_file_is_refused_naming_the_option_and_file(dev_files, tmp_path):
    model, folder, out = dev_files
    with pytest.raises(ConfigError, match=r"^model\.text_encoder: a Flux\.2 dev transformer file holds no text "):
        load_model(str(out / "flux2-dev.safetensors"), vae=str(out / "flux2-vae.safetensors"), tokenizer=str(folder))
    with pytest.raises(ConfigError, match=r"^model\.text_encoder: flux2-vae\.safetensors is not a Mistral Small 3 "
                                          r"text encoder: it has bn\.num_batches_tracked, which Flux\.2 dev"):
        _configured(folder, out, "flux2-vae.safetensors")
    state = to_comfyui_layout(model.text_encoders[0].state_dict())
    del state["model.layers.3.mlp.up_proj.weight"]
    save_file({k: v.contiguous() for k, v in state.items()}, str(tmp_path / "truncated.safetensors"),
              metadata={"sd_studio.config": model.text_encoders[0].config.to_json_string()})
    with pytest.raises(ConfigError, match=r"^model\.text_encoder: truncated\.safetensors is not a Mistral Small 3 "
                                          r"text encoder of this size: it has no model\.language_model\.layers\.3\."
                                          r"mlp\.up_proj\.weight"):
        load_model(str(out / "flux2-dev.safetensors"), vae=str(out / "flux2-vae.safetensors"), tokenizer=str(folder),
                   text_encoder_files={"text_encoder": str(tmp_path / "truncated.safetensors")})
    # without a config of its own a file is read as the bundled 24B one: a narrower Mistral does not fit it
    _comfy_text_encoder(model.text_encoders[0], tmp_path / "other.safetensors", config=False)
    with pytest.raises(ConfigError, match=r"^model\.text_encoder: other\.safetensors is not a Mistral Small 3 text "
                                          r"encoder \(no model\.embed_tokens\.weight of width 5120\)"):
        load_model(str(out / "flux2-dev.safetensors"), vae=str(out / "flux2-vae.safetensors"), tokenizer=str(folder),
                   text_encoder_files={"text_encoder": str(tmp_path / "other.safetensors")})
    with pytest.raises(ConfigError, match=r"^model\.tokenizer: Flux\.2 dev's single files hold no tokenizer"):
        load_model(str(out / "flux2-dev.safetensors"), vae=str(out / "flux2-vae.safetensors"), tokenizer=str(tmp_path),
                   text_encoder_files={"text_encoder": str(out / "mistral_3_small_flux2_bf16.safetensors")})


def test_full_size_mistral_small_3_comfyui_names_map_onto_every_weight():
    """ComfyUI's names of the bundled 24B architecture (built on the meta device) map back one to one,
    as do transformers 4's (language_model.model.*)."""
    from transformers import Mistral3Config, Mistral3ForConditionalGeneration
    from trainer_backend.families.flux2.components import bundled
    with torch.device("meta"):
        te = Mistral3ForConditionalGeneration(Mistral3Config.from_dict(bundled("text_encoder-mistral-small-3.json")))
    state = te.state_dict()
    assert sum(v.numel() for v in state.values()) // 10 ** 9 == 24 and te.config.text_config.num_hidden_layers == 40
    comfy = to_comfyui_layout(state)
    assert {"model.layers.39.post_attention_layernorm.weight", "model.embed_tokens.weight", "model.norm.weight",
            "vision_tower.patch_conv.weight", "multi_modal_projector.linear_1.weight"} <= set(comfy)
    assert comfy["model.embed_tokens.weight"].shape == (131072, 5120)
    assert {to_transformers_name(k) for k in comfy} == set(state) - {"lm_head.weight"}
    assert to_transformers_name("language_model.model.layers.0.self_attn.q_proj.weight") == \
        "model.language_model.layers.0.self_attn.q_proj.weight"
    assert to_transformers_name("model.layers.0.self_attn.q_proj.weight_scale") is None


def test_full_size_dev_original_layout_is_what_diffusers_single_file_converter_reads():
    from diffusers.loaders.single_file_utils import convert_flux2_transformer_checkpoint_to_diffusers
    from trainer_backend.families.flux2.components import transformer_config
    from trainer_backend.families.flux2.original_keys import to_original
    denoiser = FLUX2.meta_denoiser("dev")
    state = denoiser.state_dict()
    original = to_original(state, dict(denoiser.config))
    assert "guidance_in.in_layer.weight" in original
    config = transformer_config({k: tuple(v.shape) for k, v in original.items()}, {})
    keys = ("num_layers", "num_single_layers", "num_attention_heads", "joint_attention_dim", "guidance_embeds",
            "mlp_ratio", "in_channels")
    assert {k: config[k] for k in keys} == {k: denoiser.config[k] for k in keys}
    back = convert_flux2_transformer_checkpoint_to_diffusers(dict(original))
    assert {k: v.shape for k, v in back.items()} == {k: v.shape for k, v in state.items()}
