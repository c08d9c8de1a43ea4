"""Cached latents keep the VAE's sampling (diffusion/posterior.py): the cache holds the posterior's mean
and std in the trained latents' layout, and each step draws mean + std · eps with the sample's own eps.
The draw equals the VAE's own `latent_dist.sample` with the same generator, and a cached run trains what
an uncached run trains, step for step (the same eps reaches both), and resumes bitwise."""
import shutil

import pytest
import torch
from safetensors.torch import load_file

from conftest import make_dataset
from method_runs import train_run
from trainer_backend.diffusion.posterior import draw_latents, encode_posterior


def _model(tiny_models, arch):
    from trainer_backend.families import load_model
    return load_model(str(tiny_models(arch)), arch=arch)


def _pixels(seed=0, size=32):
    return torch.rand(2, 3, size, size, generator=torch.Generator().manual_seed(seed)) * 2 - 1


def test_the_cached_draw_equals_the_vaes_own_sample_with_the_same_generator(tiny_models):
    model = _model(tiny_models, "sd1")
    pixels = _pixels()
    mean, std = encode_posterior(model, pixels)
    assert std is not None and std.shape == mean.shape and torch.all(std > 0)
    cfg = model.vae.config
    with torch.no_grad():
        dist = model.vae.encode(pixels).latent_dist
        vae_sample = dist.sample(generator=torch.Generator().manual_seed(7)) * cfg.scaling_factor
    eps = torch.randn(mean.shape, generator=torch.Generator().manual_seed(7))
    assert torch.allclose(draw_latents(mean, std, eps), vae_sample, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("arch", ["qwen_image", "flux2"])
def test_every_family_layout_draws_what_its_uncached_encode_gives(arch, tiny_models):
    """Qwen-Image: a 5-D VAE and per-channel normalisation; Flux.2: 2x2 patches and batch-norm statistics."""
    model = _model(tiny_models, arch)
    pixels = _pixels(1)
    mean, std = encode_posterior(model, pixels)
    eps = torch.randn(mean.shape, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        uncached = model.family.encode_latents(model, pixels, eps)
    assert torch.allclose(draw_latents(mean, std, eps), uncached, rtol=1e-5, atol=1e-5)


def test_a_cached_run_trains_as_the_uncached_one_and_resumes_bitwise(tiny_models, tmp_path, fresh_accelerate_state):
    data = make_dataset(tmp_path / "data", n=2, size=32)
    model = tiny_models("sd1")
    common = ("schedule.max_steps=4", "schedule.epochs=100", "logging.log_every=1", "checkpoints.every_n_steps=2")
    _, plain, _ = train_run(tmp_path, model, data, "plain", *common)  # encodes every step
    run, cached, _ = train_run(tmp_path, model, data, "cached", *common, "dataset.cache_latents=true")
    _, on_disk, _ = train_run(tmp_path, model, data, "on-disk", *common, "dataset.cache_latents=true",
                              "dataset.cache_latents_to_disk=true", f"dataset.cache_dir={tmp_path / 'cache'}")
    steps = [[e["loss"] for e in events if e["event"] == "step"] for events in (plain, cached, on_disk)]
    assert steps[1] == pytest.approx(steps[0], rel=1e-4, abs=1e-6) and steps[2] == steps[1]
    assert all("std" in load_file(f) for f in (tmp_path / "cache" / "latents").rglob("*.safetensors"))
    resumed = tmp_path / "runs" / "resumed"
    (resumed / "checkpoints").mkdir(parents=True)
    shutil.copytree(run / "checkpoints" / "step-00000002", resumed / "checkpoints" / "step-00000002")
    train_run(tmp_path, model, data, "resumed", *common, "dataset.cache_latents=true")
    a, b = load_file(run / "cached.safetensors"), load_file(resumed / "resumed.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
