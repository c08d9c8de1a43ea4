"""Wan 2.2 building blocks: the experts' timestep split, and the tiny random two-expert pipeline
generating a 9-frame 32x32 clip on CPU, written as mp4 with a frame strip and read back."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from trainer_backend.families.wan.experts import boundary_timestep, expert_of, timestep_in_range, timestep_range


@given(st.floats(0.01, 0.99), st.floats(0, 0.999999), st.sampled_from(["high", "low", "both"]))
def test_an_expert_is_trained_only_on_the_timesteps_it_denoises(ratio, u, expert):
    boundary = boundary_timestep(ratio)
    t = timestep_in_range(u, expert, boundary)
    low, high = timestep_range(expert, boundary)
    assert low <= t < high or (t == high == low)
    if expert != "both":
        assert expert_of(t, boundary) == expert
    assert timestep_range("high", boundary)[0] == timestep_range("low", boundary)[1] == boundary  # no gap, no overlap


def test_one_transformer_means_the_whole_range():
    assert boundary_timestep(None) is None
    assert timestep_range("low", None) == (0.0, 1000.0) and expert_of(10, None) == "high"
    with pytest.raises(ValueError, match="boundary_ratio"):
        boundary_timestep(1.5)
    with pytest.raises(ValueError, match="expert"):
        timestep_range("middle", 875.0)


def test_tiny_two_expert_wan_generates_a_clip_written_as_mp4(tmp_path):
    torch = pytest.importorskip("torch")
    from diffusers import WanPipeline

    from trainer_backend.data.video import decode_frames, frame_strip, probe_clip, write_clip
    from trainer_backend.families.wan.tiny import BOUNDARY_RATIO, build_tiny_wan
    pipe = WanPipeline.from_pretrained(build_tiny_wan(tmp_path / "tiny-wan"))
    assert pipe.transformer_2 is not None and pipe.config.boundary_ratio == BOUNDARY_RATIO
    seen: dict[str, list[float]] = {"high": [], "low": []}
    pipe.transformer.register_forward_pre_hook(lambda m, a, kw: seen["high"].append(float(kw["timestep"].flatten()[0])),
                                               with_kwargs=True)
    pipe.transformer_2.register_forward_pre_hook(lambda m, a, kw: seen["low"].append(float(kw["timestep"].flatten()[0])),
                                                 with_kwargs=True)
    frames = pipe("a red square walks", num_frames=9, height=32, width=32, num_inference_steps=4, guidance_scale=1.0,
                  output_type="np", generator=torch.Generator().manual_seed(0)).frames[0]
    assert frames.shape == (9, 32, 32, 3) and np.isfinite(frames).all()
    boundary = boundary_timestep(BOUNDARY_RATIO)
    assert seen["high"] and seen["low"]  # both experts ran, each on its own side of the boundary
    assert all(expert_of(t, boundary) == "high" for t in seen["high"])
    assert all(expert_of(t, boundary) == "low" for t in seen["low"])
    clip = write_clip(tmp_path / "sample.mp4", (frames * 255).round().astype(np.uint8), fps=16)
    info = probe_clip(clip)
    assert (info.frames, info.width, info.height) == (9, 32, 32)
    assert np.abs(decode_frames(clip, [0]).astype(int) - (frames[0] * 255).round()).mean() < 12
    strip = frame_strip(frames * 255, count=4, height=24)
    assert strip.size == (4 * 24, 24)
