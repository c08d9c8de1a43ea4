"""The schema: TOML round trips, overrides, and errors that name the key (exit 2)."""
import subprocess
import sys
from pathlib import Path

import pytest

from trainer_backend import config as C
from trainer_backend.__main__ import main

ROOT = Path(__file__).resolve().parent.parent


def test_defaults_round_trip_lossless(tmp_path):
    cfg = C.load_config(None, ["network.rank=8", "optimizer.lr=3e-4", "dataset.path=/data/x y",
                               "network.target_modules=['to_q','to_v']"])
    path = tmp_path / "c.toml"
    C.save_toml(C.to_dict(cfg), path)
    again = C.load_config(path)
    assert again == cfg
    assert C.to_dict(again) == C.to_dict(cfg)


def test_sparse_preset_only_holds_changes(tmp_path):
    cfg = C.load_config(None, ["network.rank=8"])
    sparse = C.sparse_dict(cfg)
    assert sparse == {"version": 1, "network": {"rank": 8}}
    assert C.from_dict(sparse) == cfg


def test_override_types_are_coerced():
    cfg = C.load_config(None, ["schedule.batch_size=4", "dataset.flip=true", "output.name=run two",
                               "optimizer.lr=0.5"])
    assert cfg.schedule.batch_size == 4 and cfg.dataset.flip is True
    assert cfg.output.name == "run two" and cfg.optimizer.lr == 0.5


@pytest.mark.parametrize("override, key, words", [
    ("schedule.batch_size=0", "schedule.batch_size", "≥ 1"),
    ("schedule.batch_size=abc", "schedule.batch_size", "integer"),
    ("network.rank=5000", "network.rank", "≤ 1024"),
    ("precision.mixed=fp8", "precision.mixed", "one of"),
    ("network.rnak=4", "network.rnak", "did you mean 'rank'"),
    ("netwrok.rank=4", "netwrok", "did you mean 'network'"),
    ("optimizer.lr=-1", "optimizer.lr", "greater than 0"),
    ("dataset.flip=maybe", "dataset.flip", "boolean"),
])
def test_bad_values_name_the_key(override, key, words):
    with pytest.raises(C.ConfigError) as e:
        C.load_config(None, [override])
    assert str(e.value).startswith(key + ":")
    assert words in str(e.value)


def test_cli_exit_2_with_one_line_naming_the_key(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text("[schedule]\nbatch_size = 0\n")
    assert main(["validate", "--config", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "schedule.batch_size" in err[0]


def test_missing_required_paths(tmp_path, capsys):
    assert main(["validate"]) == 2
    assert "model.path" in capsys.readouterr().err
    assert main(["validate", "--set", "model.path=builtin:tiny-sd1",
                 "--set", f"dataset.path={tmp_path / 'nope'}"]) == 2
    assert "dataset.path" in capsys.readouterr().err
    assert main(["validate", "--set", f"model.path={tmp_path / 'missing-model'}"]) == 2
    assert "model.path" in capsys.readouterr().err


def test_unknown_section_and_not_toml(tmp_path, capsys):
    f = tmp_path / "x.toml"
    f.write_text("[networks]\nrank = 3\n")
    assert main(["validate", "--config", str(f)]) == 2
    assert "networks: unknown" in capsys.readouterr().err
    f.write_text("[network\nrank = 3\n")
    assert main(["validate", "--config", str(f)]) == 2
    assert "not valid TOML" in capsys.readouterr().err


def test_migration_from_version_0():
    cfg = C.from_dict({"version": 0, "network": {"dim": 12}})
    assert cfg.network.rank == 12 and cfg.version == C.CONFIG_VERSION
    with pytest.raises(C.ConfigError, match="^version:"):
        C.from_dict({"version": 99})


def test_every_field_has_help_and_a_tab():
    fields = C.all_fields()
    assert len(fields) > 40
    for f in fields:
        assert f["help"], f"{f['section']}.{f['key']} has no help text"
        assert f["tab"] != "Other", f"{f['section']} has no GUI tab"


def test_demo_preset_is_valid():
    cfg = C.load_config(ROOT / "presets" / "demo-sd1-lora.toml")
    # the committed demo base model (tools/make_demo_model.py) and dataset, found from any working directory
    from trainer_backend.config.paths import resolve_path
    assert cfg.model.path == "assets/demo_model"
    assert (Path(resolve_path(cfg.model.path)) / "model_index.json").is_file()
    assert len(list(Path(resolve_path(cfg.dataset.path)).glob("*.png"))) == 8


def test_cli_runs_as_module_with_exit_2():
    r = subprocess.run([sys.executable, "-m", "trainer_backend", "validate", "--set", "schedule.epochs=0"],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2
    assert r.stderr.strip().startswith("error: schedule.epochs")


def test_plan_and_inspect_need_only_the_dataset(capsys):
    """The GUI inspects a dataset before a model is chosen."""
    demo = ["--set", "dataset.path=assets/demo_dataset", "--set", "dataset.resolution=64"]
    assert main(["inspect", *demo]) == 0
    import json
    out = json.loads(capsys.readouterr().out)
    assert out["counts"]["subsets"][0][1] == 8  # the demo's 8 images
    assert main(["plan", *demo, "--num-processes", "2"]) == 0
    assert "total optimizer steps" in capsys.readouterr().out
