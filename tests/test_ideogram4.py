"""Ideogram 4's conditioning and objective against Ideogram4Pipeline's own functions on fixed inputs:
the text features of its encode_prompt, the packed [text][image] forward and one Euler step of its
sampler, the latents its decode reads; the resolution-aware σ density; the bundled full-size config."""
from __future__ import annotations

import math

import pytest
import torch

from trainer_backend.families import load_model
from trainer_backend.families.ideogram4.family import IDEOGRAM4, Ideogram4Objective, tokens_to_vae


@pytest.fixture(scope="module")
def model(tiny_models):
    return load_model(str(tiny_models("ideogram4")))


@pytest.fixture(scope="module")
def pipe(model):
    return IDEOGRAM4.build_pipeline(model)


CAPTIONS = ['{"high_level_description":"a red square","compositional_deconstruction":{"background":"white",'
            '"elements":[{"type":"obj","desc":"a red square"}]}}', "a cat"]


def test_text_features_are_the_pipelines(model, pipe):
    """Our cached features (left-padded to our length) hold the pipeline's encode_prompt features."""
    text = IDEOGRAM4.encode_text(model, IDEOGRAM4.tokenize(model, CAPTIONS, 0))
    ours, mask = text["hidden"], text["mask"]
    theirs, _, _, indicator = pipe.encode_prompt(CAPTIONS, 2, 2, 160, torch.device("cpu"))
    for b in range(len(CAPTIONS)):
        n = int(mask[b].sum())
        assert int((indicator[b] == 3).sum()) == n  # the same token count
        torch.testing.assert_close(ours[b, -n:], theirs[b, 160 - n:160], atol=1e-5, rtol=1e-5)
    assert ours[mask == 0].abs().max() == 0


def test_one_training_prediction_is_the_pipelines_euler_step(model, pipe):
    """The pipeline's first step with guidance 1 (the conditional transformer alone) moves the latents
    by (σ_next − σ)·v; our prediction at σ is the same -v in the training layout: x + (0 − σ)·predict."""
    from diffusers.pipelines.ideogram4.pipeline_ideogram4 import _logit_normal_sigmas, _resolution_aware_mu
    g = torch.Generator().manual_seed(0)
    c, h, w = 32, 4, 4  # 32 px: one token per 8x8 px in the tiny model
    x = torch.randn(1, c, h, w, generator=g)
    tokens = x.reshape(1, c, h * w).permute(0, 2, 1)
    sigma = float(_logit_normal_sigmas(1, _resolution_aware_mu(32, 32, 0.0), std=1.5)[0])
    stepped = pipe(prompt=CAPTIONS[0], height=32, width=32, num_inference_steps=1, guidance_scale=1.0,
                   guidance_schedule=None, max_sequence_length=128, latents=tokens.clone(),
                   output_type="latent").images
    text = IDEOGRAM4.encode_text(model, IDEOGRAM4.tokenize(model, CAPTIONS[:1], 0))
    with torch.no_grad():
        flow = IDEOGRAM4.predict(model, model.denoiser, x, torch.tensor([sigma * 1000]), text, {}, torch.float32)
    ours = (x - sigma * flow).reshape(1, c, h * w).permute(0, 2, 1)
    torch.testing.assert_close(ours, stepped, atol=1e-5, rtol=1e-4)


def test_a_batch_of_captions_of_different_lengths_predicts_as_each_alone(model):
    text = IDEOGRAM4.encode_text(model, IDEOGRAM4.tokenize(model, CAPTIONS, 0))
    x, t = torch.randn(2, 32, 4, 4, generator=torch.Generator().manual_seed(1)), torch.tensor([300.0, 700.0])
    with torch.no_grad():
        both = IDEOGRAM4.predict(model, model.denoiser, x, t, text, {}, torch.float32)
        for b in range(2):
            alone = {k: v[b:b + 1] for k, v in text.items()}
            one = IDEOGRAM4.predict(model, model.denoiser, x[b:b + 1], t[b:b + 1], alone, {}, torch.float32)
            torch.testing.assert_close(both[b:b + 1], one, atol=1e-5, rtol=1e-4)


def test_training_latents_decode_as_the_pipeline_decodes_them(model, pipe):
    """encode_latents' layout and normalisation are the pipeline's: its own decode of our latents (as its
    tokens) gives the VAE's decode of the posterior mean."""
    pixels = torch.rand(1, 3, 32, 32, generator=torch.Generator().manual_seed(2)) * 2 - 1
    with torch.no_grad():
        latents = IDEOGRAM4.encode_latents(model, pixels, None)
        tokens = latents.reshape(1, latents.shape[1], -1).permute(0, 2, 1)
        expected = model.vae.decode(model.vae.encode(pixels).latent_dist.mean).sample
        ours = model.vae.decode(tokens_to_vae(model.vae, tokens, 4, 4)).sample
    torch.testing.assert_close(ours, expected, atol=1e-5, rtol=1e-4)
    # the pipeline itself, with transformers that predict no motion: its output is its decode of the tokens
    zero = lambda *a, **k: (torch.zeros_like(k["hidden_states"]),)  # noqa: E731
    with torch.no_grad(), pytest.MonkeyPatch.context() as mp:
        mp.setattr(pipe.transformer, "forward", zero)
        mp.setattr(pipe.unconditional_transformer, "forward", zero)
        image = pipe(prompt="x", height=32, width=32, num_inference_steps=1, guidance_scale=1.0,
                     guidance_schedule=None, max_sequence_length=64, latents=tokens, output_type="pt").images
    torch.testing.assert_close(image, (expected / 2 + 0.5).clamp(0, 1), atol=1e-4, rtol=1e-4)


class _Loss:
    flow_shift, timestep_sampling, logit_mean, logit_std, mode_scale = 0.0, "logit_normal", 0.0, 1.0, 1.29
    timestep_min, timestep_max = 0, 1000


def test_sigma_density_is_the_pipelines_resolution_aware_logit_normal():
    """σ = sigmoid(μ_res + z): the median σ at 1024² is sigmoid(½·log(4)) = 2/3, at 512² one half."""
    objective = Ideogram4Objective(cell=16)
    for size, median in ((512, 0.5), (1024, 2 / 3)):
        shape = (128, size // 16, size // 16)
        draws = torch.stack([objective.timestep(torch.Generator().manual_seed(i), shape, _Loss()) / 1000
                             for i in range(400)])
        assert abs(draws.median().item() - median) < 0.05, (size, draws.median())
    assert math.isclose(objective._shift((128, 64, 64), _Loss()), 2.0)


def test_bundled_full_size_transformer_has_the_published_size():
    denoiser = IDEOGRAM4.meta_denoiser()
    assert sum(p.numel() for p in denoiser.parameters()) == 9_279_288_448  # 9.28 B (diffusers' defaults)
    assert len(denoiser.layers) == 34


def test_a_hub_id_downloads_both_transformers_and_loads(tiny_models, tmp_path, monkeypatch):
    """`org/name` through trainer_backend/model_sources with the family's hub files (the default pipeline
    choice): the unconditional transformer comes too (samples need it), the prompt enhancer's head and an
    fp8 copy beside the weights do not."""
    from hub_server import HubServer, point_client_at
    from trainer_backend.model_sources import resolve_model
    server = HubServer().start()
    try:
        repo = server.add_folder("org/tiny-ideogram4", tiny_models("ideogram4"))
        repo.files.update({"transformer/diffusion_pytorch_model.fp8.safetensors": b"fp8" * 1000,
                           "prompt_enhancer_head/diffusion_pytorch_model.safetensors": b"head" * 1000})
        point_client_at(monkeypatch, server, tmp_path / "hf")
        folder = resolve_model("org/tiny-ideogram4")
        assert (folder / "unconditional_transformer" / "diffusion_pytorch_model.safetensors").is_file()
        assert not (folder / "prompt_enhancer_head").exists()
        assert not (folder / "transformer" / "diffusion_pytorch_model.fp8.safetensors").exists()
    finally:
        server.stop()
    loaded = load_model(str(folder))
    assert loaded.family is IDEOGRAM4
    assert IDEOGRAM4.build_pipeline(loaded).unconditional_transformer is not None


def test_full_size_lora_in_the_original_layout_loads_through_diffusers_converter():
    """output.lora_format = "original" (diffusion_model. + fused qkv, attention.o) on the full-size
    transformer (meta): diffusers' own Ideogram 4 converter puts adapters on exactly the trained modules,
    and on a small real block the fused file applies exactly the trained update."""
    from peft import LoraConfig
    from peft.utils import get_peft_model_state_dict
    from trainer_backend.families.ideogram4.tiny import tiny_transformer

    class Meta:
        family = IDEOGRAM4

    denoiser = IDEOGRAM4.meta_denoiser()
    denoiser.add_adapter(LoraConfig(r=1, lora_alpha=1, target_modules=list(IDEOGRAM4.default_targets)))
    adapted = {n for n, m in denoiser.named_modules() if hasattr(m, "lora_A") and "default" in m.lora_A}
    state = {k: torch.zeros(v.shape) for k, v in get_peft_model_state_dict(denoiser).items()}
    Meta.denoiser = denoiser
    written = IDEOGRAM4.lora_file_state(Meta, {"transformer": state}, 1.0, "original")
    assert "diffusion_model.layers.0.attention.qkv.lora_down.weight" in written
    assert IDEOGRAM4.diffusers_lora_targets(written, denoiser) == adapted

    small = tiny_transformer(0)  # real weights: the converted update equals the trained one
    small.add_adapter(LoraConfig(r=2, lora_alpha=4, target_modules=list(IDEOGRAM4.default_targets)))
    g = torch.Generator().manual_seed(0)
    trained = {k: torch.randn(v.shape, generator=g) for k, v in get_peft_model_state_dict(small).items()}
    Meta.denoiser = small
    converted = IDEOGRAM4.pipeline_class().lora_state_dict(
        IDEOGRAM4.lora_file_state(Meta, {"transformer": trained}, 4.0, "original"))
    for module in ("layers.0.attention.to_k", "layers.0.attention.to_out.0", "layers.0.feed_forward.w2"):
        expected = 2.0 * trained[f"{module}.lora_B.weight"] @ trained[f"{module}.lora_A.weight"]
        got = converted[f"transformer.{module}.lora_B.weight"] @ converted[f"transformer.{module}.lora_A.weight"]
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_fp8_stored_weights_load_exactly(tiny_models, tmp_path):
    """A folder whose transformer is stored in float8 (as Ideogram publishes it) loads with the exact
    values (float8 -> fp32 is exact); model.quantize = "float8" then keeps it in float8 on the GPU,
    as the memory planner counts the 24 GB tier."""
    import shutil
    from safetensors.torch import load_file, save_file
    folder = tmp_path / "fp8"
    shutil.copytree(tiny_models("ideogram4"), folder)
    weights = folder / "transformer" / "diffusion_pytorch_model.safetensors"
    stored = {k: v.to(torch.float8_e4m3fn) if v.ndim == 2 else v for k, v in load_file(str(weights)).items()}
    save_file(stored, str(weights))
    loaded = load_model(str(folder)).denoiser.state_dict()
    assert all(torch.equal(loaded[k], v.float()) for k, v in stored.items())
