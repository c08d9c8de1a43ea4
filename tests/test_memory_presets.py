"""Tiered presets (<base>-<N>gb) fit their tier by the memory planner; the studio picks the tier for
the detected card, shows the memory plan, and warns before Start when a run will not fit; the CLI
`plan` prints it. Pure: no torch needed."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gui.presets import PresetStore, tier_for_card
from trainer_backend.config import from_dict, rules
from trainer_backend.launch.memory_advice import fixes, memory_lines, will_not_fit
from trainer_backend.launch.memory_plan import plan_memory

ROOT = Path(__file__).resolve().parents[1]
STORE = PresetStore(user_dir=ROOT / "presets" / "no-user-presets")
TIERED = [p for p in STORE.list() if p.builtin and re.search(r"-\d+gb$", p.name)]


# the tiers each family ships: all four where the planner says a realistic setup fits; the big
# flow-matching transformers start where their frozen weights and the text-cache pass leave room
# (docs/memory.md, "Tiered presets")
TIERS = {"sd15-lora": (8, 12, 16, 24), "sdxl-lora": (8, 12, 16, 24), "sd35-medium-lora": (8, 12, 16, 24),
         "flux-dev-lora": (8, 12, 16, 24), "zimage-turbo-lora": (12, 16, 24), "flux2-klein-4b-lora": (12, 16, 24),
         "qwen-image-lora": (16, 24), "qwen-image-edit-lora": (16, 24), "qwen-image-edit-plus-lora": (24,),
         "chroma-lora": (12, 16, 24), "ideogram4-lora": (16, 24), "krea2-lora": (16, 24),
         "qwen-image21-lora": (16, 24), "wan22-t2v-lora": (16, 24, 48, 80), "ltx2-lora": (16, 24, 48, 80),
         "wan22-ti2v-lora": (16, 24), "wan22-i2v-lora": (16, 24, 48, 80)}


def test_every_family_with_presets_has_its_tiers():
    names = {p.name for p in TIERED}
    for base, tiers in TIERS.items():
        assert {f"{base}-{gb}gb" for gb in tiers} <= names, base
    # every registered family but the old SD2 has a tiered preset
    from trainer_backend.families.registry import FAMILY_NAMES
    tiered_archs = {STORE.load(p.label).model.arch for p in TIERED}
    assert set(FAMILY_NAMES) - tiered_archs == {"sd2"}


@pytest.mark.parametrize("preset", TIERED, ids=[p.name for p in TIERED])
def test_tiered_preset_fits_its_tier(preset):
    cfg = STORE.load(preset.label)
    gb = int(re.search(r"-(\d+)gb$", preset.name).group(1))
    plan = plan_memory(cfg)
    assert plan is not None, f"no memory table for {cfg.model.arch}: run tools/make_memory_tables.py"
    assert plan.verdict(gb) == "fits", (preset.name, plan.needed_gib())
    assert rules.problems(cfg) == []  # a tier is a valid config (e.g. no quantized base with block swap)


def test_the_tier_for_a_card_is_the_largest_that_fits_it():
    names = ["sdxl-lora-8gb", "sdxl-lora-12gb", "sdxl-lora-16gb", "sdxl-lora-24gb", "sd15-lora"]
    assert tier_for_card(names, "sdxl-lora-24gb", 12.0) == "sdxl-lora-12gb"
    assert tier_for_card(names, "sdxl-lora-8gb", 23.6) == "sdxl-lora-24gb"   # a 24 GB card reports 23.6 GiB
    assert tier_for_card(names, "sdxl-lora-12gb", 80.0) == "sdxl-lora-24gb"
    assert tier_for_card(names, "sdxl-lora-12gb", 6.0) == "sdxl-lora-8gb"
    assert tier_for_card(names, "sdxl-lora-12gb", 0.0) == "sdxl-lora-12gb"   # no card detected: as chosen
    assert tier_for_card(names, "sd15-lora", 12.0) == "sd15-lora"             # not tiered


def test_quantized_base_and_block_swap_lower_the_plan_and_offload_drops_the_encoders():
    base = {"model": {"arch": "flux"}, "dataset": {"resolution": 1024, "cache_latents": True,
                                                    "cache_text_encoder_outputs": True},
            "precision": {"gradient_checkpointing": True}}
    plain = plan_memory(from_dict(base))
    int8 = plan_memory(from_dict({**base, "model": {"arch": "flux", "quantize": "int8"}}))
    nf4 = plan_memory(from_dict({**base, "model": {"arch": "flux", "quantize": "nf4"}}))
    swap = plan_memory(from_dict({**base, "memory": {"block_swap": 30}}))
    offload = plan_memory(from_dict({**base, "memory": {"offload_encoders": True}}))
    den = plain.resident["denoiser"]
    assert nf4.resident["denoiser"] < int8.resident["denoiser"] < 0.6 * den
    assert swap.resident["denoiser"] < 0.7 * den
    assert "text encoders" in plain.resident and "text encoders" not in offload.resident
    assert offload.peak_bytes < plain.peak_bytes - plain.resident["text encoders"] * 0.99


def test_an_edit_models_text_encoder_runs_every_step_and_its_control_tokens_cost_activations():
    """Qwen-Image-Edit's text encoder reads each caption with its control image: its outputs are cached per
    pair only once the latents are cached (which fixes the control image's crop), so without cached latents
    the planner counts its pass every step; the control image's latents ride along as tokens."""
    base = {"dataset": {"resolution": 1024, "cache_latents": False, "cache_text_encoder_outputs": True},
            "precision": {"gradient_checkpointing": True}}
    plain = plan_memory(from_dict({**base, "model": {"arch": "qwen_image"}}))
    edit = plan_memory(from_dict({**base, "model": {"arch": "qwen_image_edit"}}))
    assert "text encoders" not in plain.phases and edit.phases["text encoders"] > 0
    assert edit.phases["forward/backward"] > 1.3 * plain.phases["forward/backward"]
    assert edit.counts == plain.counts   # one architecture
    cached = {**base, "dataset": {**base["dataset"], "cache_latents": True}}
    edit_cached = plan_memory(from_dict({**cached, "model": {"arch": "qwen_image_edit"}}))
    assert "text encoders" not in edit_cached.phases and "text cache" in edit_cached.cache_phases


def test_eight_bit_and_paged_optimizers_and_fused_backward_lower_a_full_fine_tune():
    base = {"model": {"arch": "sdxl"}, "network": {"type": "full"}, "precision": {"gradient_checkpointing": True}}
    adam = plan_memory(from_dict(base))
    eight = plan_memory(from_dict({**base, "optimizer": {"name": "adamw8bit"}}))
    paged = plan_memory(from_dict({**base, "optimizer": {"name": "paged_adamw8bit"}}))
    fused = plan_memory(from_dict({**base, "optimizer": {"fused_backward": True}}))
    assert eight.resident["optimizer state"] == pytest.approx(adam.resident["optimizer state"] / 4, rel=0.02)
    assert paged.resident["optimizer state"] == 0
    assert fused.grads == 0 and fused.peak_bytes < adam.peak_bytes


def test_fixes_name_options_that_make_it_fit_and_respect_the_rules():
    cfg = from_dict({"model": {"arch": "flux"}, "dataset": {"resolution": 1024}})
    assert plan_memory(cfg).verdict(24) == "will not fit"
    found = fixes(cfg, "flux", 24)
    assert found
    for fix in found:   # each names real keys and values; applied, the run fits and breaks no rule
        data = {"model": {"arch": "flux"}, "dataset": {"resolution": 1024}}
        for key, value in re.findall(r"([a-z_]+\.[a-z_0-9]+) = ([^,)→ ]+)", fix):
            section, name = key.split(".")
            data.setdefault(section, {})[name] = {"true": True, "false": False}.get(value, value)
        fixed = from_dict(data)
        assert plan_memory(fixed).verdict(24) == "fits" and rules.problems(fixed) == [], fix


def test_the_plan_text_names_the_card_verdict_and_the_fix():
    cfg = from_dict({"model": {"arch": "sdxl"}, "network": {"type": "full"}, "hardware": {"gpu_memory_gb": 24}})
    text = "\n".join(memory_lines(cfg))
    assert "Peak GPU memory" in text and "24 GB ❌ will not fit" in text and "To fit 24 GB" in text
    assert "will run out of memory" in will_not_fit(cfg)
    assert will_not_fit(from_dict({"model": {"arch": "sd1"}, "hardware": {"gpu_memory_gb": 24}})) == ""


def test_studio_plan_panel_and_start_warning():
    from gui.dataset_view import START_CONFIRM_S, plan_markdown, start_memory_warning
    from trainer_backend.launch.plan import DataCounts
    cfg = from_dict({"model": {"arch": "sdxl"}, "network": {"type": "full"}, "hardware": {"gpu_memory_gb": 16}})
    summary = {"buckets": [{"width": 1024, "height": 1024, "samples": 4}, {"width": 1152, "height": 896, "samples": 2}]}
    md = plan_markdown(cfg, DataCounts(subsets=(("a", 6, 1),)), summary)
    assert "GPU memory" in md and "16 GB ❌ will not fit" in md and "1024×1024" in md
    warning = start_memory_warning(cfg, None, 1000.0)
    assert "will run out of memory" in warning and "Press Start again" in warning
    assert start_memory_warning(cfg, 1000.0, 1000.0 + START_CONFIRM_S / 2) == ""     # pressed again: start
    assert start_memory_warning(cfg, 1000.0, 1000.0 + START_CONFIRM_S + 1) != ""


def test_cli_plan_prints_the_memory_plan(tmp_path):
    data = ROOT / "assets" / "demo_dataset"
    argv = [sys.executable, "-m", "trainer_backend", "plan", "--set", f"dataset.path={json.dumps(str(data))}",
            "--set", "model.arch=sdxl", "--set", "network.type=full", "--set", "hardware.gpu_memory_gb=24",
            "--set", "dataset.resolution=64"]   # the demo images are 64×64
    out = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "Peak GPU memory" in out.stdout and "at 64×64" in out.stdout
    assert "24 GB ❌ will not fit" in out.stdout and "To fit 24 GB" in out.stdout
    out = subprocess.run(argv + ["--json"], capture_output=True, text=True, cwd=ROOT, timeout=300)
    memory = json.loads(out.stdout)["memory"]
    assert memory["verdicts"] == {"24": "will not fit"} and memory["fixes"] and memory["side"] == [64, 64]


def test_flux2_dev_preset_with_a_dev_model_gets_the_dev_tables_verdict(tmp_path):
    """flux2-dev-lora with model.path a FLUX.2-dev folder (Flux2Pipeline) is planned with the dev table: the
    80 GB card it is written for holds it, a 24 GB card does not; the CLI prints that verdict."""
    dev = tmp_path / "FLUX.2-dev"
    dev.mkdir()
    (dev / "model_index.json").write_text(json.dumps({"_class_name": "Flux2Pipeline"}))
    cfg = STORE.load("flux2-dev-lora")
    cfg.model.path = str(dev)
    plan = plan_memory(cfg)
    assert plan is not None and plan.verdict(80) == "fits" and plan.verdict(24) == "will not fit"
    assert plan.resident["denoiser"] > 25 * 2 ** 30  # 32.2 B in int8, not Klein 4B's 4 B
    cfg.model.path = ""  # as the preset ships: planned as Klein 4B, and the plan says so
    assert any("model.path is empty" in n and "flux2-dev" in n for n in plan_memory(cfg).notes)
    assert not any("model.path is empty" in n for n in plan.notes)
    data = ROOT / "assets" / "demo_dataset"
    argv = [sys.executable, "-m", "trainer_backend", "plan", "--config", str(ROOT / "presets" / "flux2-dev-lora.toml"),
            "--set", f"model.path={json.dumps(str(dev))}", "--set", f"dataset.path={json.dumps(str(data))}",
            "--set", "dataset.resolution=64", "--set", "dataset.bucketing=false", "--set", "hardware.gpu_memory_gb=80"]
    out = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "Peak GPU memory" in out.stdout and "80 GB ✅ fits" in out.stdout, out.stdout
