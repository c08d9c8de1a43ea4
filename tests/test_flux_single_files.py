"""Flux from the separate files ComfyUI users keep (transformer, clip_l, t5xxl, ae), offline: the
files load into the same model as the diffusers folder, train, and bad input is refused in one
line naming the option and the file or key."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from conftest import make_dataset
from method_runs import train_run
from trainer_backend.errors import ConfigError
from trainer_backend.families import load_configured, load_model
from trainer_backend.families.flux.single_file import export_transformer
from trainer_backend.families.sd.ldm_keys import VAE_PREFIX, vae_to_ldm


def _config_meta(config: dict) -> dict:
    return {"sd_studio.config": json.dumps({k: v for k, v in config.items() if not k.startswith("_")})}


@pytest.fixture(scope="module")
def comfy_files(tiny_models, tmp_path_factory):
    """The tiny Flux written as ComfyUI's four files: transformer (bf16, original layout), CLIP-L with
    `text_model.` names, T5 (fp16, no tied embed_tokens copy), the autoencoder in the original layout."""
    folder = tiny_models("flux")
    model = load_model(str(folder))
    out = tmp_path_factory.mktemp("comfy")
    files = {"path": export_transformer(model.denoiser, out / "unet" / "flux1-dev.safetensors", dtype=torch.bfloat16)}
    clip, t5 = model.text_encoders
    (out / "clip").mkdir()
    save_file({f"text_model.{k}": v for k, v in clip.state_dict().items() if "position_ids" not in k},
              str(out / "clip" / "clip_l.safetensors"), metadata=_config_meta(clip.config.to_dict()))
    save_file({k: v.half() for k, v in t5.state_dict().items() if k != "encoder.embed_tokens.weight"},
              str(out / "clip" / "t5xxl_fp16.safetensors"), metadata=_config_meta(t5.config.to_dict()))
    (out / "vae").mkdir()
    ae = {k.removeprefix(VAE_PREFIX): v for k, v in vae_to_ldm(model.vae.state_dict(), model.vae.config).items()}
    save_file(ae, str(out / "vae" / "ae.safetensors"), metadata=_config_meta(dict(model.vae.config)))
    return {"folder": folder, "model": model, "path": files["path"], "clip_l": out / "clip" / "clip_l.safetensors",
            "t5": out / "clip" / "t5xxl_fp16.safetensors", "vae": out / "vae" / "ae.safetensors"}


def _load(f, **changes):
    args = {"clip_l": str(f["clip_l"]), "t5": str(f["t5"]), "vae": str(f["vae"]), "tokenizer": str(f["folder"]),
            **changes}
    return load_model(str(args.pop("path", f["path"])), vae=args.pop("vae"), tokenizer=args.pop("tokenizer"),
                      text_encoder_files=args)


def test_comfyui_files_load_the_same_model_as_the_diffusers_folder(comfy_files):
    ref, got = comfy_files["model"], _load(comfy_files)
    assert got.family.name == "flux" and got.prediction_type == "flow"
    assert got.denoiser.config.guidance_embeds  # dev: has the guidance embedding
    pairs = [(ref.denoiser, got.denoiser, torch.bfloat16), (ref.text_encoders[0], got.text_encoders[0], None),
             (ref.text_encoders[1], got.text_encoders[1], torch.float16), (ref.vae, got.vae, None)]
    for want_module, got_module, dtype in pairs:
        want, have = want_module.state_dict(), got_module.state_dict()
        assert want.keys() == have.keys()
        for k in want:
            w = want[k].to(dtype).float() if dtype is not None and want[k].is_floating_point() else want[k]
            assert have[k].dtype == want[k].dtype and torch.equal(have[k], w), k
    # the T5 input embedding is the shared table, as in the original
    assert got.text_encoders[1].encoder.embed_tokens.weight is got.text_encoders[1].shared.weight
    caption = ["a red square"]
    ids = got.family.tokenize(got, caption, 75)
    assert all(torch.equal(a, b) for a, b in zip(ids, ref.family.tokenize(ref, caption, 75)))
    assert got.scheduler_config["use_dynamic_shifting"] and got.vae.config.shift_factor == ref.vae.config.shift_factor


def test_a_run_trains_from_the_comfyui_files(comfy_files, tmp_path):
    data = make_dataset(tmp_path / "data", n=2, size=32)
    f = comfy_files
    run, events, cfg = train_run(tmp_path, f["path"], data, "from-files", f"model.clip_l={f['clip_l']}",
                                 f"model.t5={f['t5']}", f"model.vae={f['vae']}", f"model.tokenizer={f['folder']}",
                                 "schedule.max_steps=2", "optimizer.lr=1e-2")
    assert [e["step"] for e in events if e["event"] == "step"] == [1, 2]
    lora = load_file(str(run / "from-files.safetensors"))
    assert any(k.startswith("transformer.single_transformer_blocks.0.") for k in lora)
    assert load_configured(cfg.model).text_encoders[1].config.d_model == 32


def _message(f, **changes) -> str:
    with pytest.raises(ConfigError) as e:
        _load(f, **changes)
    message = str(e.value)
    assert "\n" not in message
    return message


def test_bad_input_is_one_line_naming_the_option_and_the_file_or_key(comfy_files, tmp_path):
    f = comfy_files
    assert _message(f, t5="").startswith("model.t5: ") and "t5xxl" in _message(f, t5="")
    assert _message(f, clip_l=str(tmp_path / "nope.safetensors")).startswith(f"model.clip_l: {tmp_path}")
    # the CLIP file given as T5, T5 given as CLIP: named with the first key that is not there
    assert _message(f, t5=str(f["clip_l"])).startswith("model.t5: clip_l.safetensors is not a T5-XXL encoder: it has "
                                                       "no shared.weight")
    assert "is not a CLIP-L text encoder" in _message(f, clip_l=str(f["t5"]))
    # a truncated transformer names the missing original-layout key
    state = load_file(str(f["path"]))
    del state["single_blocks.0.linear2.weight"]
    cut = tmp_path / "cut.safetensors"
    with safe_open(str(f["path"]), "pt") as original:
        save_file(state, str(cut), metadata=original.metadata())
    assert _message(f, path=str(cut)) == ("model.path: cut.safetensors is not a Flux transformer of this size: it "
                                          "has no single_blocks.0.linear2.weight")
    # the full-size bundled architecture is assumed when a file carries no config: the tiny one does not fit
    save_file(load_file(str(f["t5"])), str(tmp_path / "plain_t5.safetensors"))
    assert "shared.weight is [" in _message(f, t5=str(tmp_path / "plain_t5.safetensors"))
    # a Flux file is not an SD3 model, and text-encoder files do not apply to a diffusers folder
    with pytest.raises(ConfigError, match=r"^model.arch: is 'sd3' but .*flux1-dev.safetensors is an flux model"):
        load_model(str(f["path"]), arch="sd3")
    with pytest.raises(ConfigError, match="^model.t5: applies to a Flux single file"):
        load_model(str(f["folder"]), text_encoder_files={"t5": str(f["t5"])})
    with pytest.raises(ConfigError, match="^model.tokenizer: Flux single files hold no tokenizers"):
        _load(f, tokenizer=str(tmp_path))


def test_bundled_configs_are_the_published_full_size_components():
    """What a ComfyUI file without our metadata is checked against: built on the meta device, the
    bundled configs give the published parameter counts (FLUX.1 transformer 11.9 B, T5 v1.1 XXL
    encoder 4.76 B without its 32128×4096 embedding, CLIP ViT-L/14 text 123 M, the 16-channel ae 83.8 M)."""
    from diffusers import AutoencoderKL, FluxTransformer2DModel
    from transformers import CLIPTextConfig, CLIPTextModel, T5Config, T5EncoderModel
    from trainer_backend.families.flux.components import _bundled, _weights_on_meta
    with _weights_on_meta():
        clip = CLIPTextModel(CLIPTextConfig(**_bundled("text_encoder/config.json")))
        t5 = T5EncoderModel(T5Config(**_bundled("text_encoder_2/config.json")))
        vae = AutoencoderKL.from_config(_bundled("vae/config.json"))
        transformer = FluxTransformer2DModel.from_config(_bundled("transformer/config.json"))
    count = {name: sum(p.numel() for p in m.parameters())
             for name, m in [("clip", clip), ("t5", t5), ("vae", vae), ("transformer", transformer)]}
    assert count == {"clip": 123_060_480, "t5": 4_762_310_656 + 32128 * 4096, "vae": 83_819_683,
                     "transformer": 11_901_408_320}
    assert vae.config.scaling_factor == 0.3611 and vae.config.shift_factor == 0.1159


def test_a_full_finetune_from_the_files_writes_a_transformer_file_that_loads_back(comfy_files, tmp_path):
    """bf16 mixed precision (the frozen text encoders are reloaded from their files for the output):
    the trained transformer file loads with the same clip_l/t5/ae files and differs from the base."""
    data = make_dataset(tmp_path / "data", n=2, size=32)
    f = comfy_files
    run, _, _ = train_run(tmp_path, f["path"], data, "full", f"model.clip_l={f['clip_l']}", f"model.t5={f['t5']}",
                          f"model.vae={f['vae']}", f"model.tokenizer={f['folder']}", "network.type=full",
                          "precision.mixed=bf16", "schedule.max_steps=1", "optimizer.lr=1e-3")
    trained = _load(f, path=str(run / "full.safetensors"))
    base = _load(f)
    moved = max((a - b).abs().max().item() for a, b in zip(trained.denoiser.state_dict().values(),
                                                           base.denoiser.state_dict().values()))
    assert moved > 0, "the trained transformer equals the base"
    assert torch.equal(trained.text_encoders[1].shared.weight, base.text_encoders[1].shared.weight)


def test_an_all_in_one_comfyui_checkpoint_loads_the_same_model(comfy_files, tmp_path):
    """ComfyUI's Flux "checkpoint" layout (flux1-dev-fp8.safetensors): transformer, CLIP-L, T5 and the
    autoencoder in one file under model.diffusion_model. / text_encoders.* / vae.; nothing else given
    but the tokenizers. A separate model.t5 still replaces the one inside."""
    from trainer_backend.families.flux.single_file import to_original
    ref = comfy_files["model"]
    clip, t5 = ref.text_encoders
    whole = {f"model.diffusion_model.{k}": v.to(torch.bfloat16)
             for k, v in to_original(ref.denoiser.state_dict(), dict(ref.denoiser.config)).items()}
    whole.update({f"text_encoders.clip_l.transformer.text_model.{k}": v for k, v in clip.state_dict().items()
                  if "position_ids" not in k})
    whole.update({f"text_encoders.t5xxl.transformer.{k}": v.half() for k, v in t5.state_dict().items()
                  if k != "encoder.embed_tokens.weight"})
    whole.update({f"vae.{k.removeprefix(VAE_PREFIX)}": v
                  for k, v in vae_to_ldm(ref.vae.state_dict(), ref.vae.config).items()})
    config = {"sd_studio.config": _config_meta(dict(ref.denoiser.config))["sd_studio.config"]}
    for option, module in (("clip_l", clip), ("t5", t5), ("vae", ref.vae)):
        c = module.config.to_dict() if hasattr(module.config, "to_dict") else dict(module.config)
        config[f"sd_studio.config.{option}"] = _config_meta(c)["sd_studio.config"]
    path = tmp_path / "flux1-dev-fp8.safetensors"
    save_file(whole, str(path), metadata=config)
    got = load_model(str(path), tokenizer=str(comfy_files["folder"]))
    assert got.family.name == "flux"
    pairs = [(ref.denoiser, got.denoiser, torch.bfloat16), (clip, got.text_encoders[0], None),
             (t5, got.text_encoders[1], torch.float16), (ref.vae, got.vae, None)]
    for want_module, got_module, dtype in pairs:
        want, have = want_module.state_dict(), got_module.state_dict()
        assert want.keys() == have.keys()
        for k in want:
            w = want[k].to(dtype).float() if dtype is not None and want[k].is_floating_point() else want[k]
            assert torch.equal(have[k], w), k
    other = load_file(str(comfy_files["t5"]))
    other["shared.weight"] = other["shared.weight"] + 1
    with safe_open(str(comfy_files["t5"]), "pt") as src:
        save_file(other, str(tmp_path / "t5_other.safetensors"), metadata=src.metadata())
    replaced = load_model(str(path), tokenizer=str(comfy_files["folder"]),
                          text_encoder_files={"t5": str(tmp_path / "t5_other.safetensors")})
    assert torch.equal(replaced.text_encoders[1].shared.weight, other["shared.weight"].float())
