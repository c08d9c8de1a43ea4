"""The planner plans the model given (issue 29 items 8-10): the family and size of a builtin tiny model, a
diffusers folder's own weights; memory without a scannable dataset; the tier preset that fits a card
no single option makes fit. Pure: no torch but where a tiny model is built to compare with."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from trainer_backend.config import from_dict, load_config
from trainer_backend.launch.memory_advice import fitting_presets, memory_lines, size_text
from trainer_backend.launch.memory_plan import plan_memory
from trainer_backend.launch.memory_tables import GiB, family_table
from trainer_backend.launch.model_size import (builtin_entry, folder_components, planning_arch, resize_table,
                                               shapes_component, sized_table)

ROOT = Path(__file__).resolve().parents[1]
DEMOS = sorted((ROOT / "presets").glob("demo-*.toml"))


@pytest.mark.parametrize("preset", DEMOS, ids=[p.stem for p in DEMOS])
def test_every_demo_preset_is_planned_for_its_tiny_model_in_megabytes(preset):
    cfg = load_config(preset)
    arch = planning_arch(cfg)
    assert arch != "auto", preset.name
    plan = plan_memory(cfg)
    assert plan is not None and plan.arch == arch
    assert plan.peak_bytes < 64 * 2 ** 20, (preset.name, plan.peak_bytes)   # megabytes, not tens of GiB
    text = "\n".join(memory_lines(cfg, card_gb=8))
    assert "unknown" not in text and "MiB allocated" in text


def test_a_builtin_models_recorded_size_is_what_its_own_files_say():
    """assets/memory_tables.json "builtin" is folder_components of the built tiny model (the planner's own
    reader): rebuild one and compare, so the recorded sizes cannot drift from the factory."""
    from trainer_backend.families import resolve_model_path
    for name in ("tiny-sd1",):   # the tests' most built tiny model (tests/conftest.py shares its cache)
        entry = builtin_entry(name)
        folder = resolve_model_path(f"builtin:{name}")
        assert entry["components"] == folder_components(folder, family_table(entry["family"])["components"]), name


def test_a_folder_is_sized_from_its_weight_headers():
    """The demo's SD1-architecture model (assets/demo_model): its family from model_index.json (SD1, the
    nearer of the two families that use StableDiffusionPipeline), its parameters counted exactly."""
    from safetensors import safe_open
    cfg = from_dict({"model": {"path": str(ROOT / "assets" / "demo_model")}})
    assert planning_arch(cfg) == "sd1"
    table = sized_table("sd1", cfg.model.path)
    with safe_open(str(ROOT / "assets" / "demo_model" / "unet" / "diffusion_pytorch_model.safetensors"), "np") as f:
        exact = sum(f.get_slice(k).get_shape() and __import__("math").prod(f.get_slice(k).get_shape()) for k in f.keys())
    assert table["components"]["unet"]["params"] == exact
    assert plan_memory(cfg, "sd1").peak_bytes < 64 * 2 ** 20
    # a full-size model (the table's own size) keeps the measured table
    assert sized_table("flux", "") is family_table("flux")


def test_layers_come_from_two_and_four_dimensional_weights():
    comp = shapes_component({"blocks.0.attn.to_q.weight": [64, 32], "blocks.1.attn.to_q.weight": [64, 32],
                             "conv_in.weight": [8, 4, 3, 3], "norm.weight": [64], "blocks.0.attn.to_q.bias": [64]})
    assert comp["params"] == 2 * 64 * 32 + 8 * 4 * 9 + 64 + 64
    assert comp["layers"] == [["blocks.#.attn.to_q", 32, 64, 0, 2], ["conv_in", 4, 8, 9, 1]]


@settings(max_examples=25, deadline=None)
@given(st.sampled_from(["sd1", "sdxl", "flux", "sd3", "zimage"]), st.sampled_from([256, 512, 1024]),
       st.booleans(), st.sampled_from(["lora", "full"]))
def test_a_table_resized_to_its_own_components_plans_the_same(arch, side, gc, network):
    """resize_table is the identity on the table's own model: every ratio is 1."""
    table = family_table(arch)
    same = resize_table(table, table["components"])
    cfg = from_dict({"model": {"arch": arch}, "dataset": {"resolution": side}, "network": {"type": network},
                     "precision": {"gradient_checkpointing": gc}})
    a, b = plan_memory(cfg, arch, table=table), plan_memory(cfg, arch, table=same)
    assert b.peak_bytes == pytest.approx(a.peak_bytes, rel=1e-9)


@settings(max_examples=25, deadline=None)
@given(st.floats(min_value=0.05, max_value=0.7))
def test_a_smaller_model_of_a_family_plans_smaller(shrink):
    """Components scaled down (fewer, narrower layers) give a smaller plan than the full-size table's."""
    table = family_table("flux")
    small = {name: {"params": int(c["params"] * shrink),
                    "layers": [[n, max(1, int(i * shrink)), max(1, int(o * shrink)), k, c_] for n, i, o, k, c_ in
                               c["layers"]]} for name, c in table["components"].items()}
    cfg = from_dict({"model": {"arch": "flux"}, "dataset": {"resolution": 512}})
    assert plan_memory(cfg, table=resize_table(table, small)).peak_bytes < plan_memory(cfg, table=table).peak_bytes


def test_sizes_read_in_the_unit_that_fits():
    assert size_text(2.4 * 2 ** 20) == "2.4 MiB" and size_text(300 * 2 ** 20) == "300 MiB"
    assert size_text(15.23 * GiB) == "15.2 GiB"


def test_the_tier_preset_that_fits_is_named_when_no_option_does():
    cfg = load_config(ROOT / "presets" / "flux-dev-lora-24gb.toml")
    assert fitting_presets(cfg, "flux", 8)[0].startswith("flux-dev-lora-8gb ")
    text = "\n".join(memory_lines(cfg, card_gb=8))
    assert "No option here makes it fit 8 GB; the preset flux-dev-lora-8gb" in text


def test_memory_is_planned_without_a_dataset(tmp_path):
    """The studio's plan panel and the CLI `plan` show the memory plan at dataset.resolution when there is
    no dataset (the step count needs one)."""
    from gui.dataset_view import memory_only_markdown
    cfg = load_config(ROOT / "presets" / "sdxl-lora-12gb.toml")
    text = memory_only_markdown(cfg)
    assert "needs a dataset" in text and "**Peak GPU memory: " in text and "GiB" in text
    r = subprocess.run([sys.executable, "-m", "trainer_backend", "plan", "--config", "presets/sdxl-lora-12gb.toml"],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 2 and "dataset.path" in r.stderr
    assert "Peak GPU memory:" in r.stdout and "12 GB ✅ fits" in r.stdout


def test_a_single_files_family_is_read_from_its_keys_as_the_trainer_reads_it(tmp_path):
    """A single .safetensors file with model.arch = "auto": the studio asks families.detect_family (in a
    subprocess: the families import torch) and plans that family's full-size table."""
    import torch
    from safetensors.torch import save_file
    from gui.dataset_view import memory_only_markdown, model_family
    path = tmp_path / "flux1-dev.safetensors"   # the original (BFL) layout's key Flux's detect_file reads
    save_file({"double_blocks.0.img_attn.qkv.weight": torch.zeros(2, 2)}, str(path))
    cfg = from_dict({"model": {"path": str(path)}, "dataset": {"resolution": 512}})
    assert planning_arch(cfg) == "auto"               # the pure planner cannot tell a file's family
    assert model_family(cfg) == "flux"
    text = memory_only_markdown(cfg, model_family(cfg))
    assert "unknown" not in text and "Peak GPU memory: " in text
    nothing = tmp_path / "other.safetensors"
    save_file({"w": torch.zeros(2)}, str(nothing))
    assert model_family(from_dict({"model": {"path": str(nothing)}})) == "auto"
