"""Models: tiny factory, loading (folder / single file / builtin), export, text encoding."""
from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
import torch

from trainer_backend.config import ConfigError
from trainer_backend.families import builtin
from trainer_backend.families.sd import tiny
from trainer_backend.families.sd.loader import build_pipeline, detect_arch, load_model
from trainer_backend.families.sd.single_file import META_CONFIG
from trainer_backend.families.sd.single_file_export import save_single_file
from trainer_backend.families.sd.text import encode_text, sdxl_add_time_ids, tokenize
from trainer_backend.families.sd.tokenizers import find_tokenizers

ARCHES = ["sd1", "sd2", "sdxl"]
ROOT = Path(__file__).resolve().parent.parent


def _pipeline_class(arch):
    from diffusers import StableDiffusionPipeline, StableDiffusionXLPipeline
    return StableDiffusionXLPipeline if arch == "sdxl" else StableDiffusionPipeline


def _same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return set(sa) == set(sb) and all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.fixture(scope="module")
def exported(tiny_models, tmp_path_factory):
    """arch -> single-file export of the tiny model."""
    out = tmp_path_factory.mktemp("single-files")
    return {arch: save_single_file(tiny_models(arch), out / f"tiny-{arch}.safetensors") for arch in ARCHES}


@pytest.mark.parametrize("arch", ARCHES)
def test_tiny_model_loads_in_diffusers_and_generates(arch, tmp_path):
    folder = tiny.make_tiny_model(arch, tmp_path / arch)
    size_mb = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) / 2**20
    assert size_mb < 10
    pipe = _pipeline_class(arch).from_pretrained(folder, local_files_only=True)
    assert pipe.scheduler.config.prediction_type == ("v_prediction" if arch == "sd2" else "epsilon")
    pipe.set_progress_bar_config(disable=True)
    image = pipe("a photo of a dog", num_inference_steps=2, height=32, width=32, output_type="np",
                 generator=torch.Generator().manual_seed(0)).images[0]
    assert image.shape == (32, 32, 3)
    assert float(image.std()) > 0 and bool(torch.isfinite(torch.from_numpy(image)).all())
    if arch == "sdxl":
        assert type(pipe.text_encoder_2).__name__ == "CLIPTextModelWithProjection"
        assert pipe.text_encoder.config.hidden_size != pipe.text_encoder_2.config.hidden_size
        assert pipe.unet.config.addition_embed_type == "text_time"
    if arch == "sd2":
        assert pipe.unet.config.use_linear_projection


def test_tiny_model_is_deterministic_for_a_seed(tmp_path):
    def unet_bytes(seed: int, name: str) -> bytes:
        folder = tiny.build_tiny_model("sd1", tmp_path / name, seed=seed)
        return (folder / "unet" / "diffusion_pytorch_model.safetensors").read_bytes()
    assert unet_bytes(0, "a") == unet_bytes(0, "b")
    assert unet_bytes(0, "a") != unet_bytes(1, "c")


def test_tiny_tokenizer_handles_any_caption(tiny_models):
    from transformers import CLIPTokenizer
    tok = CLIPTokenizer.from_pretrained(tiny_models("sd1") / "tokenizer")
    caption = "A photo of a sks dog, standing on the beach. Ünïcødé 日本 😀 " + "very long " * 60
    ids = tok(caption, padding="max_length", max_length=77, truncation=True).input_ids
    assert len(ids) == 77 and ids[0] == tok.bos_token_id and ids[-1] == tok.eos_token_id
    assert tok.decode(ids, skip_special_tokens=True).startswith("a photo of a sks dog , standing on the beach")
    assert tok.convert_ids_to_tokens(tok("dog").input_ids)[1:-1] == ["dog</w>"]  # common words are merged


@pytest.mark.parametrize("arch", ARCHES)
def test_detect_arch_for_folders_and_single_files(arch, tiny_models, exported):
    assert detect_arch(str(tiny_models(arch))) == arch
    assert detect_arch(str(exported[arch])) == arch


@pytest.mark.parametrize("arch", ARCHES)
def test_single_file_round_trip_keeps_every_weight(arch, tiny_models, exported):
    original = load_model(str(tiny_models(arch)))
    reloaded = load_model(str(exported[arch]))
    assert reloaded.arch == arch and reloaded.prediction_type == original.prediction_type
    assert _same_weights(original.unet, reloaded.unet)
    assert _same_weights(original.vae, reloaded.vae)
    assert len(reloaded.text_encoders) == len(original.text_encoders) == (2 if arch == "sdxl" else 1)
    for a, b in zip(original.text_encoders, reloaded.text_encoders):
        assert _same_weights(a, b)
    captions = ["a red square", "sks dog on a beach"]
    assert all(torch.equal(x, y) for x, y in zip(tokenize(original, captions), tokenize(reloaded, captions)))


@pytest.mark.parametrize("arch", ARCHES)
def test_exported_file_loads_in_plain_diffusers(arch, tiny_models, exported):
    """Other tools read the original key layout; diffusers' own converter must agree with ours."""
    pipe = _pipeline_class(arch).from_single_file(str(exported[arch]), config=str(tiny_models(arch)),
                                                  local_files_only=True)
    original = load_model(str(tiny_models(arch)))
    assert _same_weights(pipe.unet, original.unet) and _same_weights(pipe.vae, original.vae)
    assert _same_weights(pipe.text_encoder, original.text_encoders[0])


@pytest.mark.parametrize("arch", ARCHES)
def test_bundled_configs_match_real_models(arch):
    """The bundled SD1.5 / SD2.1 / SDXL configs build the published architectures (parameter counts),
    and our export of that layout is what diffusers recognises as the real checkpoint family."""
    from accelerate import init_empty_weights
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from diffusers.loaders.single_file_utils import convert_ldm_unet_checkpoint, infer_diffusers_model_type
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    from trainer_backend.families.sd.ldm_keys import pipeline_to_ldm
    from trainer_backend.families.sd.single_file import detect_arch_from_keys
    folder = ROOT / "assets" / "model_configs" / arch
    with init_empty_weights():
        unet = UNet2DConditionModel.from_config(UNet2DConditionModel.load_config(folder / "unet"))
        vae = AutoencoderKL.from_config(AutoencoderKL.load_config(folder / "vae"))
        encoders = [CLIPTextModel(CLIPTextConfig.from_pretrained(folder / "text_encoder"))]
        if arch == "sdxl":
            encoders.append(CLIPTextModelWithProjection(CLIPTextConfig.from_pretrained(folder / "text_encoder_2")))
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    published = {"sd1": (859_520_964, [123_060_480]), "sd2": (865_910_724, [340_387_840]),
                 "sdxl": (2_567_463_684, [123_060_480, 694_659_840])}
    assert (count(unet), [count(e) for e in encoders]) == published[arch]
    assert count(vae) == 83_653_863
    state = pipeline_to_ldm(arch, unet, vae, encoders)
    assert infer_diffusers_model_type(state) == {"sd1": "v1", "sd2": "v2", "sdxl": "xl_base"}[arch]
    assert detect_arch_from_keys({k: tuple(v.shape) for k, v in state.items()}) == arch
    assert set(convert_ldm_unet_checkpoint(state, dict(unet.config))) == set(unet.state_dict())


@pytest.mark.parametrize("arch", ARCHES)
def test_loaded_model_describes_the_model(arch):
    model = load_model(f"builtin:tiny-{arch}")
    pipe = build_pipeline(model)
    assert model.arch == arch
    assert model.prediction_type == ("v_prediction" if arch == "sd2" else "epsilon")
    assert type(model.noise_scheduler).__name__ == "DDPMScheduler"
    assert model.noise_scheduler.config.prediction_type == model.prediction_type
    assert model.vae_scale_factor == pipe.vae_scale_factor == 2
    assert len(model.tokenizers) == len(model.text_encoders)
    assert pipe.unet is model.unet and pipe.text_encoder is model.text_encoders[0]  # shared, not copied


@pytest.mark.parametrize("arch", ARCHES)
def test_encode_text_matches_the_pipeline(arch):
    model = load_model(f"builtin:tiny-{arch}")
    pipe = build_pipeline(model)
    captions = ["a photo of a sks dog", "", "a watercolor painting of a red house by the sea"]
    with torch.no_grad():
        hidden, pooled = encode_text(model, tokenize(model, captions))
        expected = pipe.encode_prompt(captions, device="cpu", num_images_per_prompt=1,
                                      do_classifier_free_guidance=False)
    assert hidden.shape[:2] == (3, 77)
    assert (hidden - expected[0]).abs().max().item() <= 1e-6
    if arch == "sdxl":
        assert hidden.shape[-1] == model.unet.config.cross_attention_dim
        assert (pooled - expected[2]).abs().max().item() <= 1e-6
    else:
        assert pooled is None


def test_text_encoder_lora_gets_gradients():
    from peft import LoraConfig
    model = load_model("builtin:tiny-sdxl")
    for encoder in model.text_encoders:
        encoder.requires_grad_(False)
        encoder.add_adapter(LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    hidden, pooled = encode_text(model, tokenize(model, ["a dog"]))
    (hidden.square().mean() + pooled.square().mean()).backward()
    for encoder in model.text_encoders:
        # lora_B starts at zero, so it is the one that receives gradient first (layer 0 feeds every output)
        grad = encoder.get_submodule("text_model" if hasattr(encoder, "text_model") else "").encoder \
            .layers[0].self_attn.q_proj.lora_B["default"].weight.grad
        assert grad is not None and grad.abs().sum() > 0


def test_sdxl_add_time_ids_match_the_pipeline():
    pipe = build_pipeline(load_model("builtin:tiny-sdxl"))
    ids = sdxl_add_time_ids((48, 64), (4, 0), (32, 32))
    expected = pipe._get_add_time_ids((48, 64), (4, 0), (32, 32), dtype=torch.float32,
                                      text_encoder_projection_dim=pipe.text_encoder_2.config.projection_dim)
    assert torch.equal(ids[None], expected)


def test_overrides_prediction_type_and_vae(tiny_models, tmp_path):
    model = load_model("builtin:tiny-sd1", prediction_type="v_prediction", vae=str(tiny_models("sd2")))
    assert model.noise_scheduler.config.prediction_type == "v_prediction"
    assert build_pipeline(model, scheduler="ddim").scheduler.config.prediction_type == "v_prediction"
    assert _same_weights(model.vae, load_model(str(tiny_models("sd2"))).vae)
    # A single-file VAE in the original layout (no prefix), as VAEs are usually shared.
    from safetensors.torch import save_file

    from trainer_backend.families.sd.ldm_keys import VAE_PREFIX, vae_to_ldm
    sdxl_vae = load_model(str(tiny_models("sdxl"))).vae
    state = {k.removeprefix(VAE_PREFIX): v for k, v in vae_to_ldm(sdxl_vae.state_dict(), dict(sdxl_vae.config)).items()}
    save_file(state, str(tmp_path / "vae.safetensors"))
    assert _same_weights(load_model("builtin:tiny-sd1", vae=str(tmp_path / "vae.safetensors")).vae, sdxl_vae)


def test_builtin_is_built_once_and_reused(tmp_path, monkeypatch):
    monkeypatch.setenv("SD_STUDIO_CACHE", str(tmp_path))
    results: list[Path] = []
    threads = [threading.Thread(target=lambda: results.append(builtin.resolve_model_path("builtin:tiny-sd1")))
               for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 2 and results[0] == results[1]
    folder = results[0]
    assert folder.parent == tmp_path / "models" and (folder / "model_index.json").is_file()
    assert [p.name for p in folder.parent.iterdir()] == [folder.name]  # no half-built leftovers
    stamp = (folder / "unet" / "config.json").stat().st_mtime_ns
    assert builtin.resolve_model_path("builtin:tiny-sd1") == folder
    assert (folder / "unet" / "config.json").stat().st_mtime_ns == stamp


def test_single_file_without_tokenizer_asks_for_model_tokenizer(exported, tmp_path, monkeypatch):
    """Real checkpoints carry no tokenizer: with none in the HF cache the error names model.tokenizer."""
    from safetensors.torch import load_file, save_file
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hf-cache"))
    bare = tmp_path / "bare.safetensors"
    save_file(load_file(str(exported["sd1"])), str(bare), metadata={"format": "pt"})
    assert detect_arch(str(bare)) == "sd1"  # from the key layout alone
    with pytest.raises(ConfigError, match=r"^model\.tokenizer: "):
        load_model(str(bare))


def test_tokenizer_folder_serves_every_arch(tiny_models):
    sdxl = find_tokenizers("sdxl", str(tiny_models("sdxl")))
    assert [t.pad_token for t in sdxl] == ["<|endoftext|>", "!"]
    sd2 = find_tokenizers("sd2", str(tiny_models("sd1") / "tokenizer"))  # a bare tokenizer folder
    assert sd2[0].pad_token == "!" and sd2[0]("a dog", padding="max_length").input_ids[-1] == sd2[0].pad_token_id


def test_tokenizer_found_in_the_hugging_face_cache(tiny_models, tmp_path, monkeypatch):
    """A single file's tokenizer comes from an offline HF cache laid out like a real download."""
    import shutil
    repo = tmp_path / "hub" / "models--openai--clip-vit-large-patch14"
    commit = "0123456789abcdef0123456789abcdef01234567"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    shutil.copytree(tiny_models("sd1") / "tokenizer", repo / "snapshots" / commit)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    first, second = find_tokenizers("sdxl")
    assert len(first) == len(second) == tiny.vocab_size()
    assert (first.pad_token, second.pad_token) == ("<|endoftext|>", "!")


@pytest.mark.parametrize("make_path, key", [
    (lambda p: "", "model.path"),
    (lambda p: str(p / "missing"), "model.path"),
    (lambda p: "builtin:tiny-sd3", "model.path"),
    (lambda p: str(p), "model.path"),  # a folder without model_index.json
    (lambda p: _write(p / "notes.txt", "hello"), "model.path"),
    (lambda p: _write(p / "junk.safetensors", "not a safetensors file"), "model.path"),
    (lambda p: _unrelated_safetensors(p / "other.safetensors"), "model.path"),
])
def test_bad_model_paths_name_model_path(make_path, key, tmp_path):
    with pytest.raises(ConfigError) as err:
        load_model(make_path(tmp_path))
    assert str(err.value).startswith(f"{key}: ") and "\n" not in str(err.value)


def test_bad_vae_and_arch_name_their_keys(tmp_path):
    with pytest.raises(ConfigError, match=r"^model\.vae: .*missing"):
        load_model("builtin:tiny-sd1", vae=str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match=r"^model\.arch: "):
        load_model("builtin:tiny-sd1", arch="sdxl")


def test_embedded_config_paths_are_sanitised(exported, tmp_path):
    """Config files embedded in a checkpoint may not escape the cache folder."""
    from safetensors.torch import load_file, save_file

    from trainer_backend.families.sd.single_file import materialize_embedded_config
    evil = json.dumps({"model_index.json": "{}", "../escape.json": "{}"})
    assert materialize_embedded_config({META_CONFIG: evil}, tmp_path / "cache") is None
    assert not (tmp_path / "escape.json").exists()
    tampered = tmp_path / "tampered.safetensors"
    save_file(load_file(str(exported["sd1"])), str(tampered), metadata={META_CONFIG: evil})
    with pytest.raises(ConfigError, match=r"^model\.tokenizer: "):  # falls back to the real-model route
        load_model(str(tampered))


def _write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def _unrelated_safetensors(path: Path) -> str:
    from safetensors.torch import save_file
    save_file({"encoder.weight": torch.zeros(2, 2)}, str(path))
    return str(path)


def test_tiny_model_with_sd_latent_proportions(tmp_path):
    """vae_downsample=8 gives SD's latent size (used by bench/data.py): 64 px -> 8×8 latents."""
    import torch
    from trainer_backend.families.sd.loader import build_pipeline, load_model
    from trainer_backend.families.sd.tiny import build_tiny_model
    model = load_model(str(build_tiny_model("sd1", tmp_path / "m", vae_downsample=8)))
    assert model.vae_scale_factor == 8
    latents = model.vae.encode(torch.zeros(1, 3, 64, 64)).latent_dist.mean
    assert tuple(latents.shape) == (1, 4, 8, 8)
    pipe = build_pipeline(model)
    pipe.set_progress_bar_config(disable=True)
    image = pipe("a red square", num_inference_steps=2, height=64, width=64, output_type="np").images[0]
    assert image.shape == (64, 64, 3)
