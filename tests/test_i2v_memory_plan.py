"""The memory planner for Wan 2.2 I2V: the first-frame condition's VAE pass is a phase of its own, counted per
4-frame chunk as the causal VAE runs (checked against the real pass on a tiny model), and left out of the
denoiser's lines, so an I2V plan is T2V's plus that phase instead of an upper bound that grows per latent frame."""
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
    full-size one (the condition pass alone, and the step without it)."""
    overrides = {"model": {"arch": ARCH}, "network": {"rank": 4}, "precision": {"mixed": "no"}}
    table = mp.measure_table(tiny_loader(), overrides, (32, 64), device="meta", networks=("lora",),
                             log=lambda *_: None, condition="condition")
    return {**table, "vae_frames_at_once": 4}


def real_condition_peak(model, side: int, frames: int) -> int:
    """Peak bytes of the family's own condition pass on real CPU tensors: a cached clip of `frames` frames."""
    latent_frames = (frames - 1) // 4 + 1
    sample = {"latents": torch.zeros(1, *model.family.latent_shape(model, side, side, frames))}
    with mp.LiveBytes() as tally, torch.no_grad():
        model.family.condition(model, sample, latent_frames)
    return tally.peak


@pytest.mark.parametrize("side", [64, 96])
def test_the_planned_condition_pass_bounds_the_real_one_per_chunk(side):
    table = tiny_table()
    model = tiny_loader()()
    pixels = (side // table["vae_scale_factor"]) ** 2
    for frames in (5, 17, 33):
        real = real_condition_peak(model, side, frames)
        planned = condition_bytes(table, pixels, min(frames, 4), frames) / VAE_ENCODE_CUDA
        assert real <= planned <= 1.45 * real, (side, frames, planned, real)
    # 33 frames (9 latent frames) cost far less than 9 one-frame passes: the VAE works 4 frames at a time
    assert real_condition_peak(model, side, 33) < 5 * real_condition_peak(model, side, 1)


def test_the_tiny_step_lines_leave_the_condition_pass_out():
    """The step measured with the condition given is the denoiser's alone: below the step that builds it."""
    table = tiny_table()
    overrides = {"model": {"arch": ARCH}, "network": {"rank": 4}, "precision": {"mixed": "no"}}
    with_pass = mp.measure_table(tiny_loader(), overrides, (32, 64), device="meta", networks=("lora",),
                                 log=lambda *_: None)
    assert "condition_pass" not in with_pass and table["condition_pass"]["line"][1] > 0
    for network in ("lora", "lora_gc"):
        (a, b), (a_with, b_with) = table["activations"][network], with_pass["activations"][network]
        assert a + b * 64 < a_with + b_with * 64, network   # at 64 px (8x8 latent pixels)


def plan(arch: str, frames: int, res: int = 640, **memory):
    return plan_memory(from_dict({"model": {"arch": arch, "expert": "low"},
                                  "dataset": {"resolution": res, "video_frames": frames, "cache_latents": True,
                                              "cache_text_encoder_outputs": True},
                                  "precision": {"gradient_checkpointing": True},
                                  "memory": {"block_swap": 20, "offload_encoders": True, **memory}}))


def test_an_i2v_plan_is_t2vs_step_with_the_condition_as_its_own_phase():
    for frames in (17, 81):
        t2v, i2v = plan("wan22_t2v", frames), plan(ARCH, frames)
        assert i2v.phases["forward/backward"] == pytest.approx(t2v.phases["forward/backward"], rel=0.01)
        assert "condition" not in t2v.phases and i2v.phases["condition"] > 0
    short, long = plan(ARCH, 17), plan(ARCH, 81)
    # the step's activations grow with the latent frames (5 -> 21); the condition pass by the pixels held only
    assert long.phases["forward/backward"] - long.grads > 3 * (short.phases["forward/backward"] - short.grads)
    assert long.phases["condition"] < 1.5 * short.phases["condition"]
    # offloaded, the VAE comes in for the pass
    assert plan(ARCH, 17).phases["condition"] > plan(ARCH, 17, offload_encoders=False).phases["condition"]
