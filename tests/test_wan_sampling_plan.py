"""The memory planner's sample round for Wan 2.2 A14B training one expert (launch/memory_sampling.py): the frozen
expert joins the GPU for samples whole, or under memory.block_swap / offload_encoders one block at a time beside
its small non-block parts, stored as the base is (model.quantize); the tier presets' sample prompts fit."""
from __future__ import annotations

from pathlib import Path

import pytest

from gui.presets import PresetStore
from trainer_backend.launch.memory_plan import plan_memory
from trainer_backend.launch.memory_sampling import DEFAULT_SAMPLE_FRAMES
from trainer_backend.launch.memory_tables import GiB, family_table, weight_bytes

ROOT = Path(__file__).resolve().parents[1]


def preset(name: str, **sets):
    cfg = PresetStore(user_dir=ROOT / "presets" / "no-user-presets").load(name).model_copy(deep=True)
    for dotted, value in sets.items():
        section, key = dotted.split("__")
        setattr(getattr(cfg, section), key, value)
    return cfg


def samples(cfg) -> float:
    """Bytes on the GPU at the sample round's peak (0: the plan has no sample round)."""
    return plan_memory(cfg).phase_totals().get("samples", 0.0)


def test_the_frozen_expert_streams_through_the_sample_round_at_its_stored_size():
    den = family_table("wan22_t2v")["components"]["transformer"]
    prompt = "a fox runs through snow --w 832 --h 480 --f 33"
    swapped = samples(preset("wan22-t2v-lora-24gb", samples__prompts=prompt))
    whole = samples(preset("wan22-t2v-lora-24gb", samples__prompts=prompt, memory__block_swap=0,
                           memory__offload_encoders=False))
    int8 = weight_bytes(den, "bf16", "int8")
    # without the memory options the whole int8 expert comes (and the trained one stays whole too)
    assert whole > int8 + plan_memory(preset("wan22-t2v-lora-24gb", memory__block_swap=0)).resident["denoiser"]
    # with them: its two neighbouring blocks and its non-block parts, never the whole expert
    assert swapped < plan_memory(preset("wan22-t2v-lora-24gb")).peak_bytes + 0.1 * int8
    bf16 = samples(preset("wan22-t2v-lora-24gb", samples__prompts=prompt, model__quantize="none",
                          memory__block_swap=0, memory__offload_encoders=False))
    assert bf16 - whole > 0.4 * weight_bytes(den, "bf16", "none")  # stored as the base: int8 halves it
    longer = samples(preset("wan22-t2v-lora-24gb", samples__prompts=prompt.replace("--f 33", "--f 81")))
    assert longer > swapped   # a longer clip's activations


@pytest.mark.parametrize("name", ["wan22-t2v-lora-16gb", "wan22-t2v-lora-24gb"])
def test_the_tier_presets_sample_and_the_round_fits_the_tier(name):
    cfg = preset(name)
    assert cfg.samples.prompts and cfg.samples.every_n_steps
    plan = plan_memory(cfg)
    assert "samples" in plan.phases
    card = int(name.rsplit("-", 1)[1].removesuffix("gb"))
    assert plan.verdict(card) == "fits", plan.to_dict()


def test_no_sample_round_without_prompts_a_frozen_expert_or_for_one_denoiser():
    assert samples(preset("wan22-t2v-lora-24gb", samples__prompts="", samples__every_n_steps=0)) == 0
    both = preset("wan22-t2v-lora-24gb", model__expert="both")   # both experts train: none only samples
    assert samples(both) == 0
    assert samples(preset("flux-dev-lora-24gb", samples__prompts="a fox")) == 0


def test_the_planners_sample_frames_are_the_familys():
    from trainer_backend.families.registry import get_family
    assert get_family("wan22_t2v").sample_frames == DEFAULT_SAMPLE_FRAMES == get_family("wan22_i2v").sample_frames


def test_the_16gb_tier_needs_its_text_encoder_quantized_for_the_samples():
    """UMT5-XXL in bf16 (10.6 GiB) comes in whole for the sample prompts beside the trained expert."""
    bf16_te = plan_memory(preset("wan22-t2v-lora-16gb", model__quantize_text_encoders="none"))
    assert bf16_te.peak_phase == "samples" and bf16_te.verdict(16) == "will not fit"
    assert bf16_te.phase_totals()["samples"] > 10.6 * GiB
