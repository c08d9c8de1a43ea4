"""Qwen-Image and Qwen-Image-Edit beyond the conformance suite: the text conditioning is what the
diffusers pipelines compute; a LoRA file in each layout loads in diffusers onto the full-size
architecture and, on the tiny model, gives exactly the trained model's images; an edit run trains on
pairs (a missing control image is one warning and that image is skipped); the single files ComfyUI
users keep load the same model as the diffusers folder."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file, save_file

from conftest import make_dataset
from method_runs import train_run
from trainer_backend.config import ConfigError, load_config
from trainer_backend.families import get_family, load_model

ARCHS = ["qwen_image", "qwen_image_edit"]
RED = Image.new("RGB", (64, 64), (200, 30, 30))


def _pipe(family, folder):
    """The plain diffusers pipeline of a tiny folder (the edit model's processor loaded offline)."""
    from trainer_backend.families.qwen_image.text import load_processor
    extra = {"processor": load_processor(folder / "processor")} if family.edit else {}
    pipe = family.pipeline_class().from_pretrained(str(folder), local_files_only=True, **extra)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _image(pipe, family) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    extra = {"image": RED} if family.edit else {}
    return torch.from_numpy(pipe(prompt="a red square", num_inference_steps=2, height=64, width=64, generator=g,
                                 output_type="np", **extra).images[0])


def _text_batch(captions: list[str]) -> dict:
    """A batch of captions, each with the red control image (as the dataset serves it, in [-1, 1])."""
    red = torch.from_numpy(np.array(RED)).permute(2, 0, 1).float() / 127.5 - 1
    return {"caption": captions, "control_pixel_values": torch.stack([red] * len(captions))}


@pytest.mark.parametrize("arch", ARCHS)
def test_text_conditioning_is_what_the_pipeline_encodes(arch, tiny_models):
    """Captions of different lengths in one batch: the valid tokens and the mask equal the pipeline's
    encode_prompt (template, dropped prefix, last hidden layer; the edit model's image tokens too)."""
    family = get_family(arch)
    model = load_model(str(tiny_models(arch)))
    captions = ["a red square", "a small blue circle on a plain white background"]
    with torch.no_grad():
        ours = family.encode_text(model, family.tokenize_batch(model, _text_batch(captions), 75))
        pipe = family.build_pipeline(model)
        extra = {"image": [RED, RED]} if family.edit else {}
        theirs, mask = pipe.encode_prompt(prompt=captions, device=torch.device("cpu"), **extra)
    assert mask is not None and not mask.all()  # the shorter caption is padded
    for i in range(2):
        n = int(mask[i].sum())
        assert int(ours["mask"][i].sum()) == n
        torch.testing.assert_close(ours["hidden"][i, :n], theirs[i, :n], rtol=1e-5, atol=1e-5)


def _randomized_adapters(model, layout: str, tmp_path):
    from trainer_backend.methods import setup_method
    from trainer_backend.methods.kohya_format import save_lora_file
    from trainer_backend.methods.lora import adapter_state_dicts, alpha_for_module
    cfg = load_config(None, ["network.rank=4", "network.alpha=8", f"output.lora_format={layout}"])
    trained = setup_method(model, cfg)
    torch.manual_seed(0)
    for p in trained.parameters():
        torch.nn.init.normal_(p, std=0.2)
    return save_lora_file(tmp_path / f"{layout}.safetensors", model, adapter_state_dicts(trained.modules),
                          alpha=alpha_for_module(cfg), metadata={}, layout=layout)


@pytest.mark.parametrize("layout", ["diffusers", "kohya"])
@pytest.mark.parametrize("arch", ARCHS)
def test_the_tiny_lora_in_diffusers_gives_the_trained_models_images(arch, layout, tiny_models, tmp_path):
    """Adapters (alpha ≠ rank) written in each layout: diffusers' load_lora_weights changes the image
    and then gives what the trained model's own pipeline gives, and the training forward call
    (family.predict) equals the transformer call of the diffusers pipeline with the file loaded."""
    family, folder = get_family(arch), tiny_models(arch)
    model = load_model(str(folder))
    path = _randomized_adapters(model, layout, tmp_path)
    pipe = _pipe(family, folder)
    before = _image(pipe, family)
    pipe.load_lora_weights(str(path))
    after = _image(pipe, family)
    assert (after - before).abs().max() > 1e-3, "the LoRA did not change the output"
    trained = _image(family.build_pipeline(model), family)
    assert (after - trained).abs().max() <= 1e-5

    g = torch.Generator().manual_seed(3)
    latents = torch.randn(1, 4, 8, 8, generator=g)
    batch = _text_batch(["a red square"])
    with torch.no_grad():
        if family.edit:
            batch["control_latents"] = family.encode_latents(model, batch["control_pixel_values"], None)
        text = family.encode_text(model, family.tokenize_batch(model, batch, 75))
        ours = family.predict(model, model.denoiser, latents, torch.tensor([500.0]), text, batch, torch.float32)
        tokens, shapes = pipe._pack_latents(latents, 1, 4, 8, 8), [(1, 4, 4)]
        if family.edit:
            tokens = torch.cat([tokens, pipe._pack_latents(batch["control_latents"], 1, 4, 8, 8)], dim=1)
            shapes.append((1, 4, 4))
        embeds, mask = pipe.encode_prompt(prompt=["a red square"], device=torch.device("cpu"),
                                          **({"image": [RED]} if family.edit else {}))
        out = pipe.transformer(hidden_states=tokens, timestep=torch.tensor([0.5]), encoder_hidden_states=embeds,
                               encoder_hidden_states_mask=mask, img_shapes=[shapes], return_dict=False)[0][:, :16]
    theirs = pipe._unpack_latents(out, 64, 64, 8)[:, :, 0]
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("arch", ARCHS)
def test_full_size_comfyui_layout_keys_all_load_in_diffusers(arch):
    """The kohya/ComfyUI layout on the full-size transformer (meta device): diffusers' converter puts
    every adapter back on exactly the adapted modules (the diffusers layout: the conformance suite)."""
    from peft import LoraConfig
    from peft.utils import get_peft_model_state_dict
    family = get_family(arch)
    denoiser = family.meta_denoiser()
    denoiser.add_adapter(LoraConfig(r=1, lora_alpha=1, target_modules=list(family.default_targets)))
    adapted = {name for name, m in denoiser.named_modules() if hasattr(m, "lora_A") and "default" in m.lora_A}
    assert len(adapted) == 60 * 12  # 60 blocks: 8 attention projections and 4 MLP layers each
    state = {k: torch.zeros(v.shape) for k, v in get_peft_model_state_dict(denoiser).items()}
    written = family.lora_file_state(None, {"transformer": state}, 1.0, "kohya")
    assert "lora_unet_transformer_blocks_59_img_mlp_net_0_proj.lora_down.weight" in written
    assert "lora_unet_transformer_blocks_0_attn_to_add_out.alpha" in written
    assert family.diffusers_lora_targets(written, denoiser) == adapted


def test_an_edit_run_trains_on_pairs_and_skips_an_image_without_its_control(tmp_path, tiny_models):
    """Cached latents (the VL encoder then reads each control image back from its latent) and a text
    cache that is refused, since the text depends on the control image."""
    data = make_dataset(tmp_path / "data", n=3, size=32)
    control = make_dataset(tmp_path / "control", n=3, size=32, seed=5)
    (control / "img001.png").unlink()
    run, events, _ = train_run(tmp_path, tiny_models("qwen_image_edit"), data, "edit", "schedule.max_steps=2",
                               f"dataset.control_path={control}", "optimizer.lr=1e-2",
                               "dataset.cache_latents=true", "dataset.cache_text_encoder_outputs=true")
    log = [line for line in (run / "train.log").read_text().splitlines() if "WARNING" in line]
    skipped = [line for line in log if "dataset.control_path" in line]
    assert len(skipped) == 1 and "1 of 3 images" in skipped[0] and "img001.png" in skipped[0]
    assert any("text encoder reads each caption with its control image" in line for line in log)
    assert [e["step"] for e in events if e["event"] == "step"] == [1, 2]
    lora = load_file(str(run / "edit.safetensors"))
    assert any(v.abs().max() > 0 for k, v in lora.items() if "lora_B" in k), "training did not move"


@pytest.mark.parametrize("arch", ARCHS)
def test_samples_before_the_first_step_are_the_pipelines_images(arch, tiny_models, tmp_path):
    """The trainer's samples (its own decoding of the pipeline's latents, cfg_scale as true CFG with
    the negative prompt, the edit model's --control image) equal the diffusers pipeline's output."""
    family = get_family(arch)
    data = make_dataset(tmp_path / "data", n=2, size=32)
    control = make_dataset(tmp_path / "control", n=2, size=32, seed=5)
    RED.save(tmp_path / "red.png")
    line = "a red square --n blurry --l 3 --s 3 --d 5 --w 64 --h 64" + (f" --control {tmp_path / 'red.png'}"
                                                                     if family.edit else "")
    run, events, _ = train_run(tmp_path, tiny_models(arch), data, "s", "schedule.max_steps=1",
                               *([f"dataset.control_path={control}"] if family.edit else []),
                               f"samples.prompts={json.dumps(line)}", "samples.before_first_step=true",
                               "samples.every_n_steps=1000")
    paths = [p for e in events if e["event"] == "sample" for p in e["paths"]]
    sample = np.array(Image.open(paths[0])).astype(np.int16)
    pipe = _pipe(family, tiny_models(arch))
    extra = {"image": RED} if family.edit else {}
    want = pipe(prompt="a red square", negative_prompt="blurry", true_cfg_scale=3.0, num_inference_steps=3,
                height=64, width=64, generator=torch.Generator().manual_seed(5), **extra).images[0]
    assert np.abs(sample - np.array(want).astype(np.int16)).max() <= 1


def test_the_24gb_presets_quantized_base_trains_an_edit_lora_that_loads_in_diffusers(tmp_path, tiny_models):
    """qwen-image-edit-lora-24gb's memory options on the tiny model: transformer and Qwen2.5-VL in nf4
    (the VL encoder reads the control images every step), latents cached; the file loads in a plain
    pipeline and changes the image."""
    import tomllib
    from conftest import ROOT
    preset = tomllib.loads((ROOT / "presets" / "qwen-image-edit-lora-24gb.toml").read_text())
    quant = [f"model.{k}={preset['model'][k]}" for k in ("quantize", "quantize_text_encoders")]
    assert quant == ["model.quantize=nf4", "model.quantize_text_encoders=nf4"]
    data = make_dataset(tmp_path / "data", n=2, size=32)
    control = make_dataset(tmp_path / "control", n=2, size=32, seed=5)
    run, events, _ = train_run(tmp_path, tiny_models("qwen_image_edit"), data, "q", "schedule.max_steps=2",
                               "optimizer.lr=1e-2", f"dataset.control_path={control}", "dataset.cache_latents=true",
                               *quant)
    log = (run / "train.log").read_text()
    assert "model.quantize = nf4:" in log and "model.quantize_text_encoders = nf4:" in log
    assert [e["step"] for e in events if e["event"] == "step"] == [1, 2]
    family = get_family("qwen_image_edit")
    pipe = _pipe(family, tiny_models("qwen_image_edit"))
    before = _image(pipe, family)
    pipe.load_lora_weights(str(run / "q.safetensors"))
    assert (_image(pipe, family) - before).abs().max() > 1e-3


def test_block_names_cover_every_layer_of_the_full_size_transformer():
    """network.block_lr names: block_00…block_59, BASE (embeddings in) and END (the output layers); every
    module with weights of its own belongs to one."""
    from trainer_backend.families.base import LoadedModel
    family = get_family("qwen_image")
    model = LoadedModel(family, family.meta_denoiser(), None, [], [], None, "flow", "", 8)
    owners = {name for name, m in model.denoiser.named_modules() if any(True for _ in m.parameters(recurse=False))}
    names = {name: family.block_of(model, name) for name in owners}
    assert set(names.values()) == {f"block_{i:02d}" for i in range(60)} | {"BASE", "END"}
    assert names["transformer_blocks.7.attn.to_q"] == "block_07" and names["img_in"] == "BASE"
    assert names["txt_norm"] == "BASE" and names["norm_out.linear"] == "END"


def test_training_the_text_encoder_is_refused_naming_the_key(tiny_models):
    from trainer_backend.methods import load_method_model
    cfg = load_config(None, [f"model.path={tiny_models('qwen_image')}", "network.train_text_encoder=true"])
    refusal = r"^network.train_text_encoder: Qwen-Image \(model.arch qwen_image\) keeps its text encoder frozen"
    with pytest.raises(ConfigError, match=refusal):
        load_method_model(cfg)


@pytest.fixture(scope="module")
def comfy_files(tiny_models, tmp_path_factory):
    """The tiny Qwen-Image as ComfyUI keeps it: the transformer under model.diffusion_model., the text
    encoder in transformers 4's names (model.layers…, visual…), and the VAE folder."""
    folder = tiny_models("qwen_image")
    out = tmp_path_factory.mktemp("qwen-comfy")
    model = load_model(str(folder))
    config = json.dumps({k: v for k, v in model.denoiser.config.items() if not k.startswith("_")})
    save_file({f"model.diffusion_model.{k}": v.contiguous() for k, v in model.denoiser.state_dict().items()},
              str(out / "qwen_image_bf16.safetensors"), metadata={"sd_studio.config": config})
    te = model.text_encoders[0]
    old = {}
    for k, v in te.state_dict().items():
        k = k.replace("model.language_model.", "model.").replace("model.visual.", "visual.")
        old[k] = v.contiguous()
    save_file(old, str(out / "qwen_2.5_vl_7b.safetensors"), metadata={"sd_studio.config": te.config.to_json_string()})
    vae_config = json.dumps({k: v for k, v in model.vae.config.items() if not k.startswith("_")})
    save_file({k: v.contiguous() for k, v in model.vae.state_dict().items()}, str(out / "qwen_image_vae.safetensors"),
              metadata={"sd_studio.config": vae_config})
    return folder, out


def test_comfyui_files_load_the_same_model_as_the_diffusers_folder(comfy_files, tiny_models):
    from trainer_backend.families import load_model as load
    folder, files = comfy_files
    transformer, te = str(files / "qwen_image_bf16.safetensors"), str(files / "qwen_2.5_vl_7b.safetensors")
    want = load_model(str(folder))
    got = load(transformer, vae=str(files / "qwen_image_vae.safetensors"), tokenizer=str(folder),
               text_encoder_files={"qwen_vl": te})
    assert got.family.name == "qwen_image"
    for a, b in ((got.denoiser, want.denoiser), (got.text_encoders[0], want.text_encoders[0]), (got.vae, want.vae)):
        sa, sb = a.state_dict(), b.state_dict()
        assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    # the edit model's transformer file has the same keys: model.arch picks the family, its processor
    # comes from an edit folder
    edit = load(transformer, arch="qwen_image_edit", vae=str(folder / "vae"),
                tokenizer=str(tiny_models("qwen_image_edit")), text_encoder_files={"qwen_vl": te})
    assert edit.family.name == "qwen_image_edit" and type(edit.tokenizers[0]).__name__ == "Qwen2VLProcessor"
    with pytest.raises(ConfigError, match=r"^model.qwen_vl: .*qwen_2.5_vl_7b.safetensors"):
        load(transformer, vae=str(folder / "vae"), tokenizer=str(folder))
    with pytest.raises(ConfigError, match=r"^model.qwen_vl: qwen_image_bf16.safetensors is not a Qwen2.5-VL"):
        load(transformer, vae=str(folder / "vae"), tokenizer=str(folder), text_encoder_files={"qwen_vl": transformer})
    with pytest.raises(ConfigError, match=r"^model.tokenizer: .*processor/"):
        load(transformer, arch="qwen_image_edit", vae=str(folder / "vae"), tokenizer=str(folder),
             text_encoder_files={"qwen_vl": te})
