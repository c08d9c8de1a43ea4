"""The memory planner for Wan 2.2 I2V: the first-frame condition is cached with the latents (Family.pixel_conditions),
so the denoiser's lines leave it out; an uncached step's VAE pass for it is a phase of its own, counted per 4-frame
chunk as the causal VAE runs (checked against the real pass on a tiny model). An I2V plan is T2V's step plus that
phase instead of an upper bound that grows per latent frame."""
from __future__ import annotations

import functools

import pytest
import torch

from trainer_backend.config import from_dict
from trainer_backend.launch.memory_plan import VAE_ENCODE_CUDA, condition_bytes, plan_memory
from trainer_backend.training import memory_probe as mp

ARCH = "wan22_i2v"


def tiny_loader():
    from trainer_backend.families import load_model, resolve_model_path
    path = str(resolve_model_path(f"builtin:tiny-{ARCH}"))
    return lambda: load_model(path, arch=ARCH)


@functools.lru_cache(maxsize=1)
def tiny_table() -> dict:
    """The tiny I2V model's table, measured on the meta device as tools/make_memory_tables.py measures the
    full-size one (the condition pass alone, and the step reading the cached condition)."""
    overrides = {"model": {"arch": ARCH}, "network": {"rank": 4}, "precision": {"mixed": "no"}}
    table = mp.measure_table(tiny_loader(), overrides, (32, 64), device="meta", networks=("lora",),
                             log=lambda *_: None)
    return {**table, "vae_frames_at_once": 4}


def real_condition_peak(model, side: int, frames: int) -> int:
    """Peak bytes of the family's own condition pass on real CPU tensors for a clip of `frames` frames (the
    clip's pixels included, as the uncached step holds them)."""
    with mp.LiveBytes() as tally:
        model.family.pixel_conditions(model, torch.zeros(1, 3, frames, side, side))
    return tally.peak


@pytest.mark.parametrize("side", [64, 96])
def test_the_planned_condition_pass_bounds_the_real_one_per_chunk(side):
    table = tiny_table()
    model = tiny_loader()()
    pixels = (side // table["vae_scale_factor"]) ** 2
    for frames in (1, 5, 17, 33):
        real = real_condition_peak(model, side, frames)
        planned = condition_bytes(table, pixels, min(frames, 4), frames) / VAE_ENCODE_CUDA
        assert real <= planned <= 1.3 * real, (side, frames, planned, real)
    # 33 frames (9 latent frames) cost far less than 9 one-frame passes: the VAE works 4 frames at a time
    assert real_condition_peak(model, side, 33) < 7 * real_condition_peak(model, side, 1)


def test_the_i2v_step_is_t2vs_step_once_the_condition_is_cached():
    """The tables' step reads the condition from the batch (as a cached step does): the tiny I2V model's
    activation lines are the tiny T2V model's (the same parts but the patch embedding's extra input channels),
    where building the condition inside the step made them several times larger."""
    from trainer_backend.families import load_model, resolve_model_path
    t2v_path = str(resolve_model_path("builtin:tiny-wan22_t2v"))
    overrides = {"model": {"arch": "wan22_t2v"}, "network": {"rank": 4}, "precision": {"mixed": "no"}}
    t2v = mp.measure_table(lambda: load_model(t2v_path, arch="wan22_t2v"), overrides, (32, 64), device="meta",
                           networks=("lora",), log=lambda *_: None)
    i2v = tiny_table()
    assert "condition_pass" not in t2v and i2v["condition_pass"][1] > 0
    for network in ("lora", "lora_gc"):
        (a, b), (a_t2v, b_t2v) = i2v["activations"][network], t2v["activations"][network]
        at_64px = a + b * 64, a_t2v + b_t2v * 64   # 8x8 latent pixels
        assert at_64px[0] == pytest.approx(at_64px[1], rel=0.1), network


def plan(arch: str, frames: int, res: int = 640, cache_latents: bool = True, **memory):
    return plan_memory(from_dict({"model": {"arch": arch, "expert": "low"},
                                  "dataset": {"resolution": res, "video_frames": frames, "cache_latents": cache_latents,
                                              "cache_text_encoder_outputs": True},
                                  "precision": {"gradient_checkpointing": True},
                                  "memory": {"block_swap": 20, "offload_encoders": True, **memory}}))


def test_an_i2v_plan_is_t2vs_step_with_an_uncached_condition_as_its_own_phase():
    for frames in (17, 81):
        for cached in (True, False):
            t2v, i2v = plan("wan22_t2v", frames, cache_latents=cached), plan(ARCH, frames, cache_latents=cached)
            assert i2v.phases["forward/backward"] == pytest.approx(t2v.phases["forward/backward"], rel=0.01)
            assert "condition" not in t2v.phases
            assert ("condition" in i2v.phases) == (not cached)   # cached with the latents: no pass in the step
    short, long = plan(ARCH, 17, cache_latents=False), plan(ARCH, 81, cache_latents=False)
    # the step's activations grow with the latent frames (5 -> 21); the condition pass by the pixels held only
    assert long.phases["forward/backward"] - long.grads > 3 * (short.phases["forward/backward"] - short.grads)
    assert long.phases["condition"] < 2 * short.phases["condition"]
    # offloaded, the VAE comes in for the pass
    on_card = plan(ARCH, 17, cache_latents=False, offload_encoders=False)
    assert short.phases["condition"] > on_card.phases["condition"]
