"""Presets: sparse TOML round trip, name sanitising, read-only built-ins, migrations, no secrets."""
from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from trainer_backend.config import TrainConfig, sparse_dict, to_dict

from gui.presets import BUILTIN_DIR, PresetError, PresetStore, sanitize_name
from gui.schema_form import form_fields

REQUIRED_BUILTINS = ["demo-sd1-lora", "sd15-lora", "sdxl-lora-24gb", "sdxl-lora-12gb", "sdxl-dreambooth-lora",
                     "sd15-full-finetune"]


@pytest.fixture()
def store(tmp_path):
    return PresetStore(tmp_path / "user")


def test_builtin_presets_exist_load_and_name_no_local_paths(store):
    names = [p.name for p in store.list() if p.builtin]
    for wanted in REQUIRED_BUILTINS:
        assert wanted in names
    path_fields = [f for f in form_fields() if f.widget == "path"]
    for preset in store.list():
        cfg = store.load(preset.label)
        raw = tomllib.loads(preset.path.read_text())
        assert raw["version"] == cfg.version
        for f in path_fields:
            value = raw.get(f.section, {}).get(f.key, "")
            assert not Path(value).is_absolute(), f"{preset.name}: {f.dotted} is an absolute local path"
    assert store.load("sdxl-lora-12gb (built-in)").model.arch == "sdxl"
    assert store.load("sd15-full-finetune (built-in)").network.type == "full"


def test_save_writes_sparse_toml_and_loads_back_identical(store):
    cfg = store.load("demo-sd1-lora (built-in)")
    cfg.schedule.batch_size = 3
    cfg.network.target_modules = ["to_q", "to_v"]
    preset = store.save("my preset", cfg)
    assert preset.path.parent == store.user_dir.resolve()
    text = preset.path.read_text()
    data = tomllib.loads(text)
    assert data == sparse_dict(cfg)          # only what differs from the defaults, plus version
    assert "optimizer" in data and "beta1" not in data["optimizer"]
    assert to_dict(store.load("my preset")) == to_dict(cfg)
    assert "my preset" in store.labels()


@pytest.mark.parametrize("name", ["../../etc/passwd", "a/b\\c", "../x", ".hidden", "x" * 300, "nul\x00byte",
                                  " spaced  name ", "évé:nt*?"])
def test_preset_names_cannot_leave_the_presets_folder(store, name):
    preset = store.save(name, TrainConfig())
    assert preset.path.parent == store.user_dir.resolve()
    assert preset.path.name == f"{sanitize_name(name)}.toml"
    assert not preset.path.name.startswith(".")
    assert len(preset.path.stem) <= 64


@pytest.mark.parametrize("name", ["", "   ", "..", "...", "/", "::"])
def test_unusable_names_are_refused(store, name):
    with pytest.raises(PresetError):
        store.save(name, TrainConfig())


def test_builtin_presets_are_read_only(store):
    with pytest.raises(PresetError, match="built-in"):
        store.save("demo-sd1-lora", TrainConfig())
    with pytest.raises(PresetError, match="read-only"):
        store.delete("demo-sd1-lora (built-in)")
    assert (BUILTIN_DIR / "demo-sd1-lora.toml").exists()


def test_save_as_does_not_overwrite_and_delete_removes(store):
    store.save("mine", TrainConfig())
    with pytest.raises(PresetError, match="exists"):
        store.save("mine", TrainConfig(), overwrite=False)
    store.delete("mine")
    assert "mine" not in store.labels()
    with pytest.raises(PresetError):
        store.load("mine")


def test_old_version_preset_is_migrated(store):
    store.user_dir.mkdir(parents=True)
    (store.user_dir / "old.toml").write_text("version = 0\n[network]\ndim = 8\n")
    cfg = store.load("old")
    assert cfg.network.rank == 8 and cfg.version >= 1


def test_broken_preset_reports_the_key(store):
    store.user_dir.mkdir(parents=True)
    (store.user_dir / "bad.toml").write_text("version = 1\n[schedule]\nbatch_sise = 2\n")
    with pytest.raises(PresetError, match=r"schedule\.batch_sise.*batch_size"):
        store.load("bad")


def test_sdxl_dreambooth_preset_generates_class_images_by_default(store, tmp_path):
    """Its comment promises prior preservation: with only subject images, the scan plans class
    images to generate and the plan counts them."""
    from PIL import Image

    from trainer_backend.config import from_dict, to_dict
    from trainer_backend.data.scan import scan_dataset

    subject = tmp_path / "dog"
    subject.mkdir()
    for i in range(3):
        Image.new("RGB", (64, 64), (40 * i, 80, 120)).save(subject / f"{i}.png")
    data = to_dict(store.load("sdxl-dreambooth-lora (built-in)"))
    assert data["dataset"]["class_prompt"] and data["dataset"]["num_class_images"] > 0
    data["dataset"].update(path=str(subject), resolution=64)
    data["model"]["path"] = "builtin:tiny-sdxl"
    scan = scan_dataset(from_dict(data))
    assert scan.summary["class_images_to_generate"] == data["dataset"]["num_class_images"]
    assert scan.counts.class_images > 0
