"""A kohya_ss file cannot break the import (issue 37 item 8): every unusable value is a line in
the report (never an OverflowError/ValueError/RecursionError toast), size and depth are capped
before parsing, nothing is echoed back at length, paths that climb out are flagged. kohya's
defaults are "mapped (default)" and a percentage warmup is counted with the step plan (issue 29
items 13-14)."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from conftest import make_dataset
from gui.kohya_import import (DIRECT, ImportProblem, convert_warmup, import_kohya, planned_steps, read_kohya_file,
                              report_markdown)
from gui.kohya_keys import _int
from trainer_backend.config import ConfigError, from_dict

ROOT = Path(__file__).resolve().parent.parent
INTEGER_KEYS = sorted(k for k, (_, convert) in DIRECT.items() if convert is _int)


@pytest.mark.parametrize("bad", ["inf", "1e400", "-inf", "nan", "lots", 1e400])
def test_unusable_numbers_are_report_lines(bad):
    assert len(INTEGER_KEYS) >= 25
    source = {k: bad for k in INTEGER_KEYS}
    source.update({"LoRA_type": "Kohya LoCon", "conv_dim": bad, "conv_alpha": bad, "unet_lr": bad,
                   "text_encoder_lr": bad, "lr_warmup": bad, "max_train_epochs": bad, "network_alpha": bad,
                   "learning_rate": bad})
    result = import_kohya(json.dumps(source, allow_nan=True) if not isinstance(bad, str) else source)
    reported = {k for k, _ in result.unsupported}
    expected = set(INTEGER_KEYS) | {"conv_dim", "unet_lr", "text_encoder_lr", "max_train_epochs",
                                    "network_alpha", "learning_rate"}
    assert expected <= reported, expected - reported
    result.config()  # what was imported validates
    assert "not usable here" in report_markdown(result)
    alone = import_kohya({"lr_warmup": bad} if isinstance(bad, str) else '{"lr_warmup": 1e400}')
    assert "not usable here" in dict(alone.unsupported)["lr_warmup"]


def test_size_and_depth_are_capped_before_parsing(tmp_path):
    with pytest.raises(ImportProblem, match="nested more than 8 levels"):
        import_kohya("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ImportProblem, match="a config is a few KB"):
        import_kohya(json.dumps({"train_data_dir": "x" * (40 * 1024 * 1024)}))
    # a long value inside a small file: one short report line, not the value
    result = import_kohya({"sample_prompts": "a cat " * 2000, "train_data_dir": "/d", "extra": {"a": [1]}})
    text = report_markdown(result)
    assert len(text) < 2000 and "a text of 12,000 characters" in text and "a nested value" in text
    # the studio reads the file itself only if it is a small regular file
    big = tmp_path / "big.json"
    with open(big, "wb") as f:
        f.truncate(8 * 1024 * 1024)
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    for path, expected in ((big, "is larger than 1 MB"), (fifo, "is a FIFO (named pipe), not a regular file"),
                           (Path("/dev/zero"), "is a device, not a regular file")):
        with pytest.raises(ConfigError) as e:
            read_kohya_file(path)
        assert str(e.value) == f"kohya_ss file: {path} {expected}" or str(e.value).startswith(
            f"kohya_ss file: {path} {expected}")


def test_paths_that_climb_out_or_cannot_exist_are_flagged():
    result = import_kohya({"train_data_dir": "../../etc", "output_dir": "/out\u0000x", "reg_data_dir": "/r" * 3000})
    assert any("`train_data_dir` = '../../etc' climbs out of its folder" in n for n in result.notes)
    problems = dict(result.unsupported)
    assert problems["output_dir"].startswith("the path contains a NUL character")
    assert "characters" in problems["reg_data_dir"]
    assert "output" not in result.data


def test_kohya_defaults_are_mapped_not_warned():
    result = import_kohya({"loss_type": "l2", "save_model_as": "safetensors", "LoRA_type": "Flux1",
                           "flux1_checkbox": True, "sdxl_no_half_vae": True, "network_dim": 8,
                           "pretrained_model_name_or_path": "/m/flux1-dev.safetensors"})
    assert not result.unsupported, result.unsupported
    assert {k for k, _, _ in result.defaults} == {"loss_type", "save_model_as", "sdxl_no_half_vae"}
    assert ("LoRA_type", "network.type", "lora") in result.mapped
    text = report_markdown(result)
    assert "Mapped (default)" in text and "Not supported" not in text
    # another value of the same key is still reported
    assert dict(import_kohya({"loss_type": "huber"}).unsupported) == {"loss_type": "huber"}


def test_percentage_warmup_is_counted_with_the_step_plan(tmp_path):
    data = make_dataset(tmp_path / "img", n=4, size=32)
    result = import_kohya({"train_data_dir": str(data), "pretrained_model_name_or_path": "builtin:tiny-sd1",
                           "max_resolution": "32,32", "epoch": 3, "train_batch_size": 1, "lr_warmup": 25,
                           "network_dim": 4, "output_dir": str(tmp_path / "runs")})
    assert result.warmup_percent == 25 and "lr_warmup" not in dict(result.unsupported)
    cfg = from_dict(result.data)
    steps, why = planned_steps(cfg)
    assert steps == 12 and why == ""  # 4 images x 3 epochs, batch 1
    convert_warmup(result, steps, why)
    assert result.config().optimizer.warmup_steps == 3
    assert any("25% of the step plan's 12 steps" in n for n in result.notes)
    # no dataset to count: said in the report, nothing guessed
    missing = import_kohya({"train_data_dir": str(tmp_path / "nowhere"), "lr_warmup": 10})
    convert_warmup(missing, *planned_steps(from_dict(missing.data)))
    assert "optimizer" not in missing.data
    assert re.match(r"10% not converted: the step count needs a dataset that can be scanned",
                    dict(missing.unsupported)["lr_warmup"])


def test_the_docs_say_flux_files_import():
    text = (ROOT / "docs" / "gui.md").read_text(encoding="utf-8")
    paragraph = text[text.index("flux1_checkbox") - 300:text.index("flux1_checkbox") + 300]
    assert "refused" not in paragraph and "cannot train those families" not in paragraph
