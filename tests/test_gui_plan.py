"""The GPUs tab's plan table and the dataset inspector, on the shipped demo dataset."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from trainer_backend.config import ConfigError, from_dict
from trainer_backend.launch.plan import plan_from_config

from gui import dataset_view as dv

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "assets" / "demo_dataset"


def cfg_with(**hardware):
    return from_dict({"model": {"path": "builtin:tiny-sd1"}, "dataset": {"path": str(DEMO), "resolution": 64,
                                                                          "repeats": 3},
                      "schedule": {"batch_size": 2, "epochs": 4}, "hardware": hardware})


@pytest.fixture(scope="module")
def inspection():
    return dv.inspect_dataset(cfg_with(), cwd=ROOT)


def rows(markdown: str) -> dict[str, tuple[str, str]]:
    out = {}
    for line in markdown.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 3 and cells[0] and not set(cells[1]) <= {"-", ":"}:
            out[cells[0]] = (cells[1], re.sub(r"\s*◀$", "", cells[2]))
    return out


def test_inspector_counts_the_demo_dataset(inspection):
    images = len([p for p in DEMO.iterdir() if p.suffix.lower() in dv.IMAGE_SUFFIXES])
    summary = inspection.summary
    assert summary["images"] == images
    assert summary["samples_per_epoch"] == images * 3
    text = dv.summary_markdown(summary)
    assert f"**{images} images**" in text and "| 3 |" in text
    assert len(dv.thumbnails(summary)) == min(images, 24)
    assert dv.buckets_frame(summary)["images"].sum() == images


def test_plan_table_compares_one_gpu_with_n(inspection):
    one = dv.plan_markdown(cfg_with(num_processes=1), inspection.counts)
    two_cfg = cfg_with(num_processes=2)
    two = dv.plan_markdown(two_cfg, inspection.counts)
    assert "2 GPUs" in two and "2 GPUs" not in one
    plan = plan_from_config(two_cfg, inspection.counts)
    table = rows(two)
    assert table["optimizer steps per epoch"] == (f"{plan.single.steps_per_epoch:,}", f"{plan.multi.steps_per_epoch:,}")
    assert table["total optimizer steps"][1] == f"{plan.multi.total_steps:,}"
    assert plan.adjustment and plan.adjustment in two
    # same_samples keeps the samples, so two GPUs take fewer optimizer steps per epoch
    assert plan.multi.steps_per_epoch < plan.single.steps_per_epoch
    assert rows(one)["total optimizer steps"][0] == rows(one)["total optimizer steps"][1]


def test_inspector_errors_name_the_dataset_field(tmp_path):
    bad = from_dict({"dataset": {"path": str(tmp_path / "missing")}})
    with pytest.raises(ConfigError, match=r"^dataset\.path"):
        dv.inspect_dataset(bad, cwd=ROOT)
    with pytest.raises(ConfigError, match=r"^dataset\.path"):
        dv.inspect_dataset(from_dict({}), cwd=ROOT)


def test_plan_shows_the_cache_pass_and_names_it_when_it_is_the_peak(inspection):
    """Flux on an nf4 base with offloaded encoders: training keeps T5-XXL off the GPU, but the text cache
    pass (before the transformer is placed) brings it in whole; the GPU memory section shows that pass
    with its total and marks it as the peak, and the headline names it."""
    from trainer_backend.launch.memory_plan import plan_memory
    cfg = from_dict({"model": {"path": "builtin:tiny-sd1", "arch": "flux", "quantize": "nf4"},
                     "memory": {"offload_encoders": True},
                     "dataset": {"path": str(DEMO), "resolution": 64, "cache_latents": True,
                                 "cache_text_encoder_outputs": True}})
    text = dv.plan_markdown(cfg, inspection.counts)
    plan = plan_memory(cfg)
    assert plan.peak_phase == "text cache"
    total = plan.phase_totals()["text cache"] / 2 ** 30
    line = next(x for x in text.splitlines() if x.startswith("Cache pass, text cache"))
    assert f"total {total:.2f} ◀ peak" in line and "text encoders" in line
    assert f"**Peak GPU memory: {plan.peak_gib:.1f} GiB** allocated (text cache," in text
    assert "Cache pass, latent cache" in text and "Training step phases" in text
