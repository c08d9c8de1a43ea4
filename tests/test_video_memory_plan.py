"""The memory planner for a video family (Wan 2.2 T2V-A14B's table, measured on the meta device): a clip's
activations scale with its latent frames, the causal VAE encodes a few frames at a time, one window is
cached at a time, model.expert = both trains two experts' weights, and the step time counts the frames."""
from __future__ import annotations

import pytest

from trainer_backend.config import from_dict
from trainer_backend.launch.memory_plan import clip_frames, plan_memory

GiB = 2 ** 30


def wan(frames=33, res=640, expert="low", **extra):
    return from_dict({"model": {"arch": "wan22_t2v", "expert": expert},
                      "dataset": {"resolution": res, "video_frames": frames, "cache_latents": True,
                                  "cache_text_encoder_outputs": True},
                      "precision": {"mixed": "bf16", "gradient_checkpointing": True}, **extra})


def test_frames_follow_the_family_rule_and_the_scanned_buckets():
    assert clip_frames(wan(frames=33), "wan22_t2v") == (33, 9)
    assert clip_frames(wan(frames=35), "wan22_t2v") == (33, 9)         # rounded down to 4k+1
    assert clip_frames(wan(frames=81), "wan22_t2v", [(832, 480, 49), (480, 832, 17)]) == (49, 13)
    assert clip_frames(from_dict({"model": {"arch": "sdxl"}}), "sdxl") == (1, 1)   # an image family


def test_activations_scale_with_latent_frames_and_the_plan_says_so():
    short, long = plan_memory(wan(frames=17)), plan_memory(wan(frames=81))
    assert short.latent_frames == 5 and long.latent_frames == 21
    assert any("81 frames (21 latent frames)" in n for n in long.notes)
    fb_short, fb_long = short.phases["forward/backward"], long.phases["forward/backward"]
    grads = short.grads
    # the checkpointed LoRA line a + b*pixels: its frame-dependent part grows 21/5 times
    assert (fb_long - grads) > 3.5 * (fb_short - grads)
    assert long.resident == short.resident   # the weights do not change with the clip length


def test_the_causal_vae_encodes_four_frames_at_a_time_and_one_window_is_cached_at_once():
    p17, p81 = plan_memory(wan(frames=17)), plan_memory(wan(frames=81))
    batch17 = p17.cache_phases["latent cache"]["latent cache batch"]
    assert batch17 == pytest.approx(p81.cache_phases["latent cache"]["latent cache batch"])
    assert batch17 < 20 * GiB


def test_both_experts_double_the_denoiser_and_its_adapters():
    low, both = plan_memory(wan(expert="low")), plan_memory(wan(expert="both"))
    assert both.resident["denoiser"] == pytest.approx(2 * low.resident["denoiser"])
    assert both.resident["adapters"] == pytest.approx(2 * low.resident["adapters"])
    assert both.counts["denoiser"] == 2 * low.counts["denoiser"]
    assert any("2 denoisers" in n for n in both.notes)


def test_a_clip_step_is_estimated_slower_than_one_frame():
    from trainer_backend.launch.memory_advice import step_time_line
    one = step_time_line(wan(frames=1), "wan22_t2v", plan_memory(wan(frames=1)), card_name="NVIDIA H100 80GB HBM3")
    clip = step_time_line(wan(frames=81), "wan22_t2v", plan_memory(wan(frames=81)), card_name="NVIDIA H100 80GB HBM3")

    def seconds(line):
        import re
        return float(re.search(r"([\d.]+) s", line).group(1))
    assert seconds(clip) > 5 * seconds(one), (one, clip)
