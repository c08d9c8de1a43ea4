"""The Z-Image family against diffusers' ZImagePipeline (text conditioning, time and sign conventions)
and from the separate files ComfyUI users keep (transformer, Qwen3, ae), offline."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from conftest import make_dataset
from method_runs import train_run
from trainer_backend.config import load_config
from trainer_backend.config.rules import problems
from trainer_backend.errors import ConfigError
from trainer_backend.families import load_model
from trainer_backend.families.sd.ldm_keys import VAE_PREFIX, vae_to_ldm
from trainer_backend.families.zimage.single_file import export_transformer


@pytest.fixture(scope="module")
def tiny(tiny_models):
    folder = tiny_models("zimage")
    return folder, load_model(str(folder))


def test_text_conditioning_is_what_the_pipeline_encodes(tiny):
    _, model = tiny
    family, pipe = model.family, model.family.build_pipeline(model)
    captions = ["a red square", "a photo of a dog on the beach, 狗"]
    with torch.no_grad():
        text = family.encode_text(model, family.tokenize(model, captions, 75))
        want, _ = pipe.encode_prompt(captions, do_classifier_free_guidance=False,
                                     max_sequence_length=family.t5_length(model))
    for i, embeds in enumerate(want):  # the pipeline keeps the caption's real tokens only
        assert torch.equal(text["hidden"][i][text["mask"][i] > 0.5], embeds)
    assert text["mask"][0].sum() < text["mask"][1].sum() < text["mask"].shape[1]


def test_euler_steps_with_the_family_prediction_are_the_pipeline_sample(tiny):
    """The pipeline's sampler from the same start, re-done with family.predict (time 1 − σ, negated
    output): equal latents, so training targets what the pipeline samples with."""
    _, model = tiny
    family, pipe = model.family, model.family.build_pipeline(model)
    start = torch.randn(1, 16, 16, 16, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = pipe("a red square", height=32, width=32, num_inference_steps=3, guidance_scale=0.0,
                    latents=start.clone(), output_type="latent", max_sequence_length=family.t5_length(model)).images
        text = family.encode_text(model, family.tokenize(model, ["a red square"], 75))
        pipe.scheduler.set_timesteps(sigmas=[1.0, 2 / 3, 1 / 3], mu=0.0)
        sigmas = pipe.scheduler.sigmas
        x = start
        for s, s_next in zip(sigmas[:-1], sigmas[1:]):
            pred = family.predict(model, model.denoiser, x, (s * 1000).reshape(1), text, {}, torch.float32)
            x = x + (s_next - s) * pred
    assert (x - want).abs().max() < 1e-5


def test_network_train_text_encoder_is_refused_naming_the_key(tiny):
    folder, _ = tiny
    cfg = load_config(None, ["model.arch=zimage", "network.train_text_encoder=true", f"model.path={folder}"])
    found = [p for p in problems(cfg) if p.key == "network.train_text_encoder"]
    assert found and "frozen" in found[0].message
    auto = load_config(None, ["network.train_text_encoder=true", f"model.path={folder}"])
    from trainer_backend.methods import load_method_model
    with pytest.raises(ConfigError, match="^network.train_text_encoder: Z-Image"):
        load_method_model(auto)  # model.arch = auto: refused once the model says what it is


def _config_meta(config: dict) -> dict:
    return {"sd_studio.config": json.dumps({k: v for k, v in config.items() if not k.startswith("_")})}


@pytest.fixture(scope="module")
def comfy_files(tiny, tmp_path_factory):
    """The tiny Z-Image as ComfyUI's three files: the transformer (bf16, original layout with fused qkv),
    Qwen3 with `model.` names, the autoencoder in the original layout."""
    folder, model = tiny
    out = tmp_path_factory.mktemp("comfy")
    path = export_transformer(model.denoiser, out / "diffusion_models" / "z_image_turbo_bf16.safetensors",
                              dtype=torch.bfloat16)
    qwen = model.text_encoders[0]
    (out / "text_encoders").mkdir()
    save_file({f"model.{k}": v for k, v in qwen.state_dict().items()}, str(out / "text_encoders" / "qwen_3_4b.safetensors"),
              metadata=_config_meta(qwen.config.to_dict()))
    (out / "vae").mkdir()
    ae = {k.removeprefix(VAE_PREFIX): v for k, v in vae_to_ldm(model.vae.state_dict(), model.vae.config).items()}
    save_file(ae, str(out / "vae" / "ae.safetensors"), metadata=_config_meta(dict(model.vae.config)))
    return {"folder": folder, "model": model, "path": path, "qwen3": out / "text_encoders" / "qwen_3_4b.safetensors",
            "vae": out / "vae" / "ae.safetensors"}


def _load(f, **changes):
    args = {"qwen3": str(f["qwen3"]), "vae": str(f["vae"]), "tokenizer": str(f["folder"]), **changes}
    return load_model(str(args.pop("path", f["path"])), vae=args.pop("vae"), tokenizer=args.pop("tokenizer"),
                      text_encoder_files=args)


def test_comfyui_files_load_the_same_model_as_the_diffusers_folder(comfy_files):
    ref, got = comfy_files["model"], _load(comfy_files)
    assert got.family.name == "zimage" and got.scheduler_config["shift"] == 3.0
    assert "layers.0.attention.qkv.weight" in load_file(str(comfy_files["path"]))
    for want_module, got_module, dtype in [(ref.denoiser, got.denoiser, torch.bfloat16),
                                           (ref.text_encoders[0], got.text_encoders[0], None), (ref.vae, got.vae, None)]:
        want, have = want_module.state_dict(), got_module.state_dict()
        assert want.keys() == have.keys()
        for k in want:
            w = want[k].to(dtype).float() if dtype is not None else want[k]
            assert torch.equal(have[k], w), k
    ids = got.family.tokenize(got, ["a red square"], 75)
    assert all(torch.equal(a, b) for a, b in zip(ids, ref.family.tokenize(ref, ["a red square"], 75)))


def test_bad_files_are_one_line_naming_the_option_and_the_key(comfy_files, tmp_path):
    f = comfy_files

    def message(**changes) -> str:
        with pytest.raises(ConfigError) as e:
            _load(f, **changes)
        assert "\n" not in str(e.value)
        return str(e.value)

    assert message(qwen3="").startswith("model.qwen3: ") and "qwen_3_4b" in message(qwen3="")
    assert message(qwen3=str(f["vae"])).startswith("model.qwen3: ae.safetensors is not a Qwen3 text encoder")
    state = load_file(str(f["path"]))
    del state["layers.1.attention.qkv.weight"]
    cut = tmp_path / "cut.safetensors"
    save_file(state, str(cut), metadata=_config_meta(dict(f["model"].denoiser.config)))
    assert message(path=str(cut)) == ("model.path: cut.safetensors is not a Z-Image transformer of this size: it "
                                      "has no layers.1.attention.qkv.weight")
    # without our metadata the published 6B architecture is assumed: the tiny file does not fit it
    save_file(load_file(str(f["qwen3"])), str(tmp_path / "plain.safetensors"))
    assert "embed_tokens.weight is [" in message(qwen3=str(tmp_path / "plain.safetensors"))
    assert message(tokenizer=str(tmp_path)).startswith("model.tokenizer: Z-Image single files hold no tokenizer")
    with pytest.raises(ConfigError, match="^model.qwen3: applies to a Z-Image single file"):
        load_model(str(f["folder"]), text_encoder_files={"qwen3": str(f["qwen3"])})


def test_a_run_trains_from_the_comfyui_files(comfy_files, tmp_path):
    data = make_dataset(tmp_path / "data", n=2, size=32)
    f = comfy_files
    run, events, _ = train_run(tmp_path, f["path"], data, "from-files", f"model.qwen3={f['qwen3']}",
                               f"model.vae={f['vae']}", f"model.tokenizer={f['folder']}", "schedule.max_steps=2",
                               "optimizer.lr=1e-2")
    assert [e["step"] for e in events if e["event"] == "step"] == [1, 2]
    lora = load_file(str(run / "from-files.safetensors"))
    assert "transformer.layers.1.attention.to_q.lora_B.weight" in lora
    assert any(v.abs().max() > 0 for k, v in lora.items() if "lora_B" in k)


@pytest.mark.parametrize("name", ["zimage-turbo-lora-24gb", "demo-zimage-lora"])
def test_presets_pass_the_rules_and_target_real_modules(name, tiny):
    from conftest import ROOT
    cfg = load_config(ROOT / "presets" / f"{name}.toml", [])
    assert problems(cfg) == []
    _, model = tiny
    leaves = {n for n, m in model.denoiser.named_modules() if isinstance(m, torch.nn.Linear)}
    for target in cfg.network.target_modules:
        assert any(n == target or n.endswith("." + target) for n in leaves), target
    assert cfg.samples.cfg_scale == 0.0  # Turbo samples without guidance


def test_samples_during_training_with_and_without_guidance(tiny, tmp_path):
    """Samples through ZImagePipeline; cfg_scale in the usual convention: 0 and 1 both mean no
    guidance (Turbo), 3 is classifier-free guidance against the negative prompt."""
    import numpy as np
    from PIL import Image
    folder, _ = tiny
    data = make_dataset(tmp_path / "data", n=2, size=32)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red square --s 2 --l 0 --d 1\na red square --s 2 --l 1 --d 1\n"
                       "a red square --n blurry --s 2 --l 3 --d 1\n")
    run, events, _ = train_run(tmp_path, folder, data, "sampled", f"samples.prompt_file={prompts}",
                               "samples.every_n_steps=1", "schedule.max_steps=1")
    paths = [p for e in events if e["event"] == "sample" for p in e["paths"]]
    assert len(paths) == 3
    images = [np.asarray(Image.open(p), dtype=np.float32) for p in paths]
    assert all(im.shape == (32, 32, 3) and im.std() > 0 for im in images)
    assert np.array_equal(images[0], images[1])  # cfg_scale 0 and 1: no guidance either way
    assert np.abs(images[2] - images[0]).max() > 0  # guided by the negative prompt


def test_a_transformer_file_in_diffusers_names_loads_too(comfy_files, tmp_path):
    """Some repackaged Z-Image files keep diffusers' names (to_q/to_k/to_v) under ComfyUI's prefix."""
    ref = comfy_files["model"]
    path = tmp_path / "z_image_diffusers_names.safetensors"
    save_file({f"model.diffusion_model.{k}": v for k, v in ref.denoiser.state_dict().items()}, str(path),
              metadata=_config_meta(dict(ref.denoiser.config)))
    got = _load(comfy_files, path=str(path))
    assert got.family.name == "zimage"
    assert all(torch.equal(a, b) for a, b in zip(got.denoiser.state_dict().values(), ref.denoiser.state_dict().values()))


def test_a_full_finetune_from_the_files_writes_a_transformer_file_that_loads_back(comfy_files, tmp_path):
    """bf16 mixed precision from ComfyUI's files: the trained transformer file (original layout) loads
    with the same qwen3/ae files and differs from the base; the frozen Qwen3 keeps its weights."""
    data = make_dataset(tmp_path / "data", n=2, size=32)
    f = comfy_files
    run, _, _ = train_run(tmp_path, f["path"], data, "full", f"model.qwen3={f['qwen3']}", f"model.vae={f['vae']}",
                          f"model.tokenizer={f['folder']}", "network.type=full", "precision.mixed=bf16",
                          "schedule.max_steps=1", "optimizer.lr=1e-3")
    assert "layers.0.attention.qkv.weight" in load_file(str(run / "full.safetensors"))
    trained, base = _load(f, path=str(run / "full.safetensors")), _load(f)
    moved = max((a - b).abs().max().item() for a, b in zip(trained.denoiser.state_dict().values(),
                                                           base.denoiser.state_dict().values()))
    assert moved > 0, "the trained transformer equals the base"
    assert torch.equal(trained.text_encoders[0].embed_tokens.weight, base.text_encoders[0].embed_tokens.weight)
