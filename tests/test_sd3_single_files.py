"""SD3 / SD3.5 from the single files people keep, offline: an all-in-one checkpoint like
`sd3_medium_incl_clips_t5xxlfp16.safetensors` (MMDiT, autoencoder and text encoders in the original
layout), or a transformer+VAE file like `sd3.5_large.safetensors` with ComfyUI's separate clip_l /
clip_g / t5xxl files. The files load into the same model as the diffusers folder, train, a full
fine-tune writes a file diffusers' own converter reads back, the full-size key sets are the ones
diffusers recognises, and bad input is refused in one line naming the option and the file or key."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from conftest import make_dataset
from method_runs import train_run
from trainer_backend.errors import ConfigError
from trainer_backend.families import load_model
from trainer_backend.families.sd.ldm_keys import vae_to_ldm
from trainer_backend.families.sd3.components import ENCODERS, component_metadata
from trainer_backend.families.sd3.single_file import PREFIX, export_checkpoint, to_original


def _cfg(module) -> dict:
    c = module.config
    c = c.to_dict() if hasattr(c, "to_dict") else dict(c)
    return {"sd_studio.config": json.dumps({k: v for k, v in c.items() if not k.startswith("_")})}


@pytest.fixture(scope="module")
def sd3_files(tiny_models, tmp_path_factory):
    """The tiny SD3 as (a) one all-in-one file with every component (T5 in fp16, no tied embed_tokens
    copy) and (b) a bf16 transformer+VAE file with ComfyUI's three separate text-encoder files."""
    folder = tiny_models("sd3")
    model = load_model(str(folder))
    out = tmp_path_factory.mktemp("sd3-files")
    own = to_original(model.denoiser.state_dict(), dict(model.denoiser.config))
    transformer = {PREFIX + k: v for k, v in own.items()}
    vae = vae_to_ldm(model.vae.state_dict(), dict(model.vae.config))
    encoders = {}
    for (option, (prefix, _, _, comfy)), encoder in zip(ENCODERS.items(), model.text_encoders):
        state = {k: v for k, v in encoder.state_dict().items()
                 if "position_ids" not in k and k != "encoder.embed_tokens.weight"}
        if option == "t5":
            state = {k: v.half() for k, v in state.items()}
        encoders[option] = (prefix, state)
        (out / "clip").mkdir(exist_ok=True)
        save_file(state, str(out / "clip" / f"{comfy}.safetensors"), metadata=_cfg(encoder))
    whole = {**transformer, **vae, **{p + k: v for p, s in encoders.values() for k, v in s.items()}}
    save_file(whole, str(out / "sd3_medium_incl_clips_t5xxlfp16.safetensors"), metadata=component_metadata(model))
    export_checkpoint(model.denoiser, model.vae, out / "sd3.5_medium.safetensors", dtype=torch.bfloat16)
    return {"folder": folder, "model": model, "whole": out / "sd3_medium_incl_clips_t5xxlfp16.safetensors",
            "path": out / "sd3.5_medium.safetensors", "clip_l": out / "clip" / "clip_l.safetensors",
            "clip_g": out / "clip" / "clip_g.safetensors", "t5": out / "clip" / "t5xxl_fp16.safetensors"}


def _load(f, path=None, **files):
    tokenizer = files.pop("tokenizer", str(f["folder"]))
    return load_model(str(path or f["path"]), vae=files.pop("vae", ""), tokenizer=tokenizer,
                      text_encoder_files={k: str(v) for k, v in files.items()})


def _same(want_module, got_module, dtype=None):
    want, have = want_module.state_dict(), got_module.state_dict()
    assert want.keys() == have.keys()
    for k in want:
        w = want[k].to(dtype).float() if dtype is not None and want[k].is_floating_point() else want[k]
        assert have[k].dtype == want[k].dtype and torch.equal(have[k], w), k


def test_the_single_files_load_the_same_model_as_the_diffusers_folder(sd3_files):
    f, ref = sd3_files, sd3_files["model"]
    whole = _load(f, f["whole"])
    assert whole.family.name == "sd3" and whole.prediction_type == "flow" and len(whole.text_encoders) == 3
    _same(ref.denoiser, whole.denoiser)
    _same(ref.vae, whole.vae)
    for (want, got, dtype) in zip(ref.text_encoders, whole.text_encoders, (None, None, torch.float16)):
        _same(want, got, dtype)
    assert whole.text_encoders[2].encoder.embed_tokens.weight is whole.text_encoders[2].shared.weight
    assert whole.scheduler_config["shift"] == 3.0 and whole.vae.config.shift_factor == ref.vae.config.shift_factor
    caption = ["a red square"]
    assert all(torch.equal(a, b) for a, b in zip(whole.family.tokenize(whole, caption, 75),
                                                 ref.family.tokenize(ref, caption, 75)))
    # the transformer+VAE file (bf16) with the three separate files; a separate file wins over the embedded one
    parts = _load(f, clip_l=f["clip_l"], clip_g=f["clip_g"], t5=f["t5"])
    _same(ref.denoiser, parts.denoiser, torch.bfloat16)
    _same(ref.vae, parts.vae, torch.bfloat16)
    _same(ref.text_encoders[1], parts.text_encoders[1])
    again = _load(f, f["whole"], clip_g=f["path"].parent / "clip" / "clip_g.safetensors")
    _same(ref.text_encoders[1], again.text_encoders[1])
    # no T5 anywhere: SD3 without it (two encoders, two tokenizers), the conditioning still T5-wide
    no_t5 = _load(f, clip_l=f["clip_l"], clip_g=f["clip_g"])
    assert len(no_t5.text_encoders) == 2 and len(no_t5.tokenizers) == 2
    text = no_t5.family.encode_text(no_t5, no_t5.family.tokenize(no_t5, caption, 75))
    assert text["hidden"].shape[-1] == ref.denoiser.config.joint_attention_dim


def test_a_run_trains_from_the_single_files(sd3_files, tmp_path):
    f = sd3_files
    data = make_dataset(tmp_path / "data", n=2, size=32)
    run, events, cfg = train_run(tmp_path, f["path"], data, "from-files", f"model.clip_l={f['clip_l']}",
                                 f"model.clip_g={f['clip_g']}", f"model.tokenizer={f['folder']}",
                                 "schedule.max_steps=2", "optimizer.lr=1e-2")
    assert [e["step"] for e in events if e["event"] == "step"] == [1, 2]
    lora = load_file(str(run / "from-files.safetensors"))
    assert any(k.startswith("transformer.transformer_blocks.1.attn.to_q.") for k in lora), sorted(lora)


def _message(f, path=None, **files) -> str:
    with pytest.raises(ConfigError) as e:
        _load(f, path, **files)
    message = str(e.value)
    assert "\n" not in message
    return message


def test_bad_input_is_one_line_naming_the_option_and_the_file_or_key(sd3_files, tmp_path):
    f = sd3_files
    assert _message(f, clip_g=f["clip_g"]) == ("model.clip_l: sd3.5_medium.safetensors holds no CLIP-L text encoder; "
                                               "give its file (ComfyUI's models/clip/clip_l.safetensors)")
    assert _message(f, clip_l=f["clip_l"]).startswith("model.clip_g: sd3.5_medium.safetensors holds no CLIP-G")
    assert _message(f, clip_l=tmp_path / "nope.safetensors", clip_g=f["clip_g"]).startswith(f"model.clip_l: {tmp_path}")
    # CLIP-L given as CLIP-G (ComfyUI's files carry no config: checked against the full-size CLIP-G), CLIP-G as
    # T5: named with the first key that does not fit
    plain = tmp_path / "plain" / "clip_l.safetensors"
    plain.parent.mkdir()
    save_file(load_file(str(f["clip_l"])), str(plain))
    assert _message(f, clip_l=f["clip_l"], clip_g=plain).startswith(
        "model.clip_g: clip_l.safetensors is not a CLIP-G text encoder: "
        "text_model.embeddings.token_embedding.weight is")
    assert _message(f, clip_l=f["clip_l"], clip_g=plain).endswith("expected [49408, 1280]")
    assert _message(f, clip_l=f["clip_l"], clip_g=f["clip_g"], t5=f["clip_g"]).startswith(
        "model.t5: clip_g.safetensors is not a T5-XXL encoder: it has no shared.weight")
    # a truncated transformer names the missing original-layout key
    state = load_file(str(f["path"]))
    del state[PREFIX + "joint_blocks.1.context_block.attn.qkv.weight"]
    cut = tmp_path / "cut.safetensors"
    with safe_open(str(f["path"]), "pt") as original:
        save_file(state, str(cut), metadata=original.metadata())
    assert _message(f, cut, clip_l=f["clip_l"], clip_g=f["clip_g"]) == (
        "model.path: cut.safetensors is not an SD3 transformer of this size: it has no "
        "joint_blocks.1.context_block.attn.qkv.weight")
    # without our metadata the file is checked against the bundled full-size architecture its shapes fit best
    save_file(load_file(str(f["path"])), str(tmp_path / "plain.safetensors"))
    assert "is not an SD3.5 Medium transformer: " in _message(f, tmp_path / "plain.safetensors", clip_l=f["clip_l"])
    # no autoencoder in the file and none given
    no_vae = tmp_path / "no_vae.safetensors"
    with safe_open(str(f["path"]), "pt") as original:
        save_file({k: v for k, v in load_file(str(f["path"])).items() if k.startswith(PREFIX)}, str(no_vae),
                  metadata=original.metadata())
    assert _message(f, no_vae, clip_l=f["clip_l"], clip_g=f["clip_g"]).startswith(
        "model.vae: no_vae.safetensors holds no autoencoder")
    # an SD3 file is not a Flux model; text-encoder files do not apply to a diffusers folder
    with pytest.raises(ConfigError, match=r"^model.arch: is 'flux' but .*sd3.5_medium.safetensors is an sd3 model"):
        load_model(str(f["path"]), arch="flux")
    with pytest.raises(ConfigError, match="^model.clip_g: applies to an SD3 single file"):
        load_model(str(f["folder"]), text_encoder_files={"clip_g": str(f["clip_g"])})
    with pytest.raises(ConfigError, match="^model.tokenizer: SD3 single files hold no tokenizers"):
        _load(f, f["whole"], tokenizer=str(tmp_path))


def test_our_full_finetune_file_is_what_diffusers_own_converter_reads(sd3_files, tmp_path):
    """The original-layout file of a full fine-tune (transformer + autoencoder, as the release files):
    diffusers' from_single_file gives the very same weights, for the transformer and the VAE."""
    from diffusers import AutoencoderKL, SD3Transformer2DModel
    f, ref = sd3_files, sd3_files["model"]
    path = export_checkpoint(ref.denoiser, ref.vae, tmp_path / "ft.safetensors")
    kw = dict(config=str(f["folder"]), local_files_only=True, dtype=torch.float32)
    _same(ref.denoiser, SD3Transformer2DModel.from_single_file(str(path), subfolder="transformer", **kw))
    _same(ref.vae, AutoencoderKL.from_single_file(str(path), subfolder="vae", **kw))
    assert ref.family.full_single_file == "denoiser"
    _same(ref.denoiser, ref.family.load_denoiser_file(path, like=ref.denoiser))


@pytest.mark.parametrize("variant,model_type,published", [("transformer_large", "sd35_large", 8.1e9),
                                                          ("transformer", "sd35_medium", 2.5e9),
                                                          ("transformer_sd3_medium", "sd3", 2.0e9)])
def test_full_size_original_layouts_are_the_ones_diffusers_recognises(variant, model_type, published):
    """On the meta device (no weights): each bundled full-size config written in the original layout is
    the model type diffusers' single-file detection names, its converter uses every key and gives the
    model's own keys and shapes, our loader picks that config back from the shapes alone, and the size
    is the published one (parameters + the position table)."""
    from diffusers import SD3Transformer2DModel
    from diffusers.loaders.single_file_utils import (convert_sd3_transformer_checkpoint_to_diffusers,
                                                     infer_diffusers_model_type)
    from trainer_backend.families.component_files import bundled
    from trainer_backend.families.sd3.components import pick_config
    config = bundled("sd3", f"{variant}/config.json")
    with torch.device("meta"):
        model = SD3Transformer2DModel.from_config(config)
    own = model.state_dict()
    original = to_original(own, config)
    assert infer_diffusers_model_type({PREFIX + k: v for k, v in original.items()}) == model_type
    left = dict(original)
    converted = convert_sd3_transformer_checkpoint_to_diffusers(left)
    assert left == {}, sorted(left)[:3]
    assert {k: v.shape for k, v in converted.items()} == {k: v.shape for k, v in own.items()}
    assert pick_config({k: tuple(v.shape) for k, v in original.items()}, {})[0] == config
    size = sum(p.numel() for p in model.parameters()) + own["pos_embed.pos_embed"].numel()
    assert abs(size / published - 1) < 0.05, size


def test_full_size_text_encoders_have_the_names_of_the_release_files():
    """The bundled CLIP-L, CLIP-G and T5-XXL on the meta device, under the prefixes of
    sd3_medium_incl_clips_t5xxlfp16.safetensors, are what diffusers' single-file checks recognise; the
    sizes are the published ones (CLIP ViT-L/14 text 123 M + projection, bigG text 695 M, T5 XXL encoder 4.76 B)."""
    from diffusers.loaders.single_file_utils import is_clip_sd3_model, is_open_clip_sd3_model, is_t5_in_single_file
    from transformers import CLIPTextConfig, CLIPTextModelWithProjection, T5Config, T5EncoderModel
    from trainer_backend.families.component_files import bundled
    whole, sizes = {}, []
    with torch.device("meta"):
        for option, (prefix, config_name, _, _) in ENCODERS.items():
            config = bundled("sd3", f"{config_name}/config.json")
            model = (T5EncoderModel(T5Config(**config)) if option == "t5"
                     else CLIPTextModelWithProjection(CLIPTextConfig(**config)))
            whole.update({prefix + k: v for k, v in model.state_dict().items()})
            sizes.append(sum(p.numel() for p in model.parameters()))
    assert is_clip_sd3_model(whole) and is_open_clip_sd3_model(whole) and is_t5_in_single_file(whole)
    # CLIP-L text 123.06 M + its 768² projection; bigG text + projection 694.7 M; T5 encoder with its shared table
    assert sizes == [123_060_480 + 768 * 768, 694_659_840, 4_762_310_656]
