"""One set of checks for the form, Start, `validate` and the trainer (issue 29 items 2 and 3): an empty
dataset folder and a model file that is not a safetensors file are refused by `run_problems`, shown
under their fields by the form, refused by Start, and a trainer that exits on such an error says one
line through the launcher (no accelerate traceback)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from trainer_backend.config import from_dict
from trainer_backend.config.checks import run_problems
from trainer_backend.config.input_checks import has_image, safetensors_header_problem

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "assets" / "demo_dataset"


def config(tmp_path: Path, **model) -> object:
    return from_dict({"model": {"path": "builtin:tiny-sd1", **model}, "dataset": {"path": str(DEMO)},
                      "output": {"dir": str(tmp_path / "runs"), "name": "r"}})


def keyed(problems) -> dict[str, str]:
    return {p.key: p.message for p in problems}


def random_file(path: Path, size: int = 2048) -> Path:
    path.write_bytes(os.urandom(size))
    return path


def test_an_empty_dataset_folder_is_a_problem_and_a_folder_with_images_in_a_subfolder_is_not(tmp_path):
    empty = tmp_path / "empty"
    (empty / "sub").mkdir(parents=True)
    (empty / "notes.txt").write_text("a caption without its image")
    (empty / ".hidden.png").write_bytes(b"skipped as the scan skips it")
    cfg = config(tmp_path)
    cfg.dataset.path = str(empty)
    found = keyed(run_problems(cfg))
    assert "no images found in" in found["dataset.path"] and str(empty) in found["dataset.path"]
    (empty / "sub" / "a.PNG").write_bytes(b"")   # present is enough here: decoding is the scan's
    assert "dataset.path" not in keyed(run_problems(cfg))


def test_the_image_walk_is_bounded(tmp_path):
    for i in range(30):
        (tmp_path / f"{i}.txt").write_text("")
    assert not has_image(tmp_path)
    assert has_image(tmp_path, limit=10)   # past the bound the scan decides, not this check


def test_a_random_file_named_safetensors_is_refused_naming_the_key_and_the_file(tmp_path):
    bad = random_file(tmp_path / "model.safetensors")
    found = keyed(run_problems(config(tmp_path, path=str(bad))))
    assert str(bad) in found["model.path"] and "not a safetensors file" in found["model.path"]
    vae = random_file(tmp_path / "vae.safetensors", 5)
    found = keyed(run_problems(config(tmp_path, vae=str(vae))))
    assert "model.vae" in found and "too short" in found["model.vae"]


def test_a_model_folder_without_model_index_is_refused(tmp_path):
    (tmp_path / "not-a-model").mkdir()
    found = keyed(run_problems(config(tmp_path, path=str(tmp_path / "not-a-model"))))
    assert "no model_index.json" in found["model.path"]
    assert "model.path" not in keyed(run_problems(config(tmp_path, path=str(ROOT / "assets" / "demo_model"))))


def test_a_real_safetensors_file_passes_and_a_truncated_one_does_not(tmp_path):
    import torch
    from safetensors.torch import save_file
    good = tmp_path / "good.safetensors"
    save_file({"w": torch.zeros(16, 16)}, str(good))
    assert safetensors_header_problem(good) == ""
    assert "model.path" not in keyed(run_problems(config(tmp_path, path=str(good))))
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(good.read_bytes()[:-100])
    assert "damaged" in safetensors_header_problem(cut)


@settings(max_examples=60, deadline=None)
@given(st.binary(max_size=300))
def test_no_byte_string_breaks_the_header_check(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("h") / "x.safetensors"
    path.write_bytes(data)
    problem = safetensors_header_problem(path)
    assert isinstance(problem, str) and problem   # random bytes are never a file with tensors


def test_header_check_reads_only_the_header(tmp_path):
    """A valid header in front of a large body: the check reads the 8 + header bytes only."""
    header = json.dumps({"w": {"dtype": "F32", "shape": [1 << 20], "data_offsets": [0, 4 << 20]}}).encode()
    path = tmp_path / "big.safetensors"
    with open(path, "wb") as f:
        f.write(len(header).to_bytes(8, "little") + header)
        f.truncate(8 + len(header) + (4 << 20))
    assert safetensors_header_problem(path) == ""


def test_the_form_and_start_refuse_the_same_problems(tmp_path):
    """The form's check is run_problems itself: the empty folder and the random model file show
    under their fields, and Start (RunManager.start) refuses with the same first line."""
    from gui.run_control import RunManager
    from gui.schema_form import config_to_values, form_fields, form_problems
    from gui.widgets import error_updates
    from trainer_backend.config import ConfigError
    (tmp_path / "empty").mkdir()
    cfg = config(tmp_path, path=str(random_file(tmp_path / "m.safetensors")))
    cfg.dataset.path = str(tmp_path / "empty")
    fields = form_fields()
    _, errors = form_problems(fields, config_to_values(fields, cfg))
    shown = {f.dotted: u["value"] for f, u in zip(fields, error_updates(fields, errors)) if u.get("visible")}
    assert "not a safetensors file" in shown["model.path"] and "no images found" in shown["dataset.path"]
    manager = RunManager(tmp_path / "runs", cwd=tmp_path)
    with pytest.raises(ConfigError) as refused:
        manager.start(cfg)
    assert str(refused.value) == str(errors[0])
    assert not (tmp_path / "runs" / "r").exists()   # nothing started, nothing written


def test_validate_names_both_problems(tmp_path):
    (tmp_path / "empty").mkdir()
    bad = random_file(tmp_path / "m.safetensors")
    r = subprocess.run([sys.executable, "-m", "trainer_backend", "validate", "--set", f"model.path={bad}",
                        "--set", f"dataset.path={tmp_path / 'empty'}", "--set", f"output.dir={tmp_path}"],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 2
    assert "model.path:" in r.stderr and "dataset.path: no images found" in r.stderr


def test_a_trainer_refusal_through_the_launcher_is_one_line_with_its_exit_code(tmp_path):
    """The trainer exits 2 with one line; accelerate's launch would add a CalledProcessError traceback
    and exit 1. The studio's argv runs the launch through launch/accelerate_launch.py."""
    from trainer_backend.config import save_toml, to_dict
    from trainer_backend.launch.argv import build_launch_argv, build_launch_env, write_strategy_files
    cfg = config(tmp_path)
    cfg.hardware.cpu = True
    cfg.precision.mixed = "no"
    run = cfg.run_dir
    run.mkdir(parents=True)
    save_toml(to_dict(cfg), run / "config.toml")
    random_file(tmp_path / "m.safetensors")
    text = (run / "config.toml").read_text().replace('path = "builtin:tiny-sd1"', f'path = "{tmp_path}/m.safetensors"')
    (run / "config.toml").write_text(text)
    write_strategy_files(cfg, run)
    argv = build_launch_argv(cfg, run / "config.toml", python=sys.executable)
    r = subprocess.run(argv, env={**os.environ, **build_launch_env(cfg)}, capture_output=True, text=True,
                       cwd=ROOT, timeout=180)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "error: model.path:" in r.stderr
    assert "Traceback" not in r.stderr and "CalledProcessError" not in r.stderr, r.stderr[-2000:]


def test_a_launcher_error_that_is_not_a_child_exit_keeps_its_traceback():
    from trainer_backend.launch.accelerate_launch import failed_child_code
    assert failed_child_code(subprocess.CalledProcessError(2, ["x"])) == 2
    assert failed_child_code(ValueError("You need to use at least 2 processes")) is None
