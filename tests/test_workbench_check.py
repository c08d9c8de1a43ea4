"""`dataset check` and the workbench's checks on a generated folder: exact and near duplicates
(a resized, re-compressed copy), a truncated JPEG, a too-small image, a non-image with an image
suffix, a 100-megapixel image, EXIF rotation, CMYK/alpha/16-bit, animation, the trainer's crop."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.workbench_images import pattern, write_dataset
from trainer_backend.data.buckets import train_crop
from trainer_backend.workbench.checks import CheckSettings, crop_of
from trainer_backend.workbench.cli import check_folder
from trainer_backend.workbench.index import thumb_path

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def messy(tmp_path_factory):
    folder = tmp_path_factory.mktemp("messy")
    write_dataset(folder, 4)
    (folder / "copy_of_0.png").write_bytes((folder / "img_00000.png").read_bytes())          # exact duplicate
    pattern(1).resize((80, 80), Image.Resampling.LANCZOS).save(folder / "smaller_1.jpg", quality=70)  # near
    buffer = folder / "whole.jpg"
    pattern(7).save(buffer, quality=90)
    (folder / "truncated.jpg").write_bytes(buffer.read_bytes()[: buffer.stat().st_size // 2])
    buffer.unlink()
    pattern(8, (20, 20)).save(folder / "tiny.png")
    (folder / "notes.png").write_bytes(b"this is a text file, not a picture\n")
    rotated = pattern(9, (96, 64))
    exif = Image.Exif()
    exif[0x0112] = 6
    rotated.save(folder / "rotated.jpg", exif=exif.tobytes())
    pattern(10).convert("CMYK").save(folder / "cmyk.jpg")
    pattern(11).convert("RGBA").save(folder / "alpha.png")
    Image.fromarray(np.arange(96 * 96, dtype=np.uint16).reshape(96, 96) * 7).save(folder / "deep.png")
    frames = [pattern(12 + k) for k in range(3)]
    frames[0].save(folder / "moving.png", save_all=True, append_images=frames[1:])
    pattern(15, (400, 64)).save(folder / "wide.png")
    return folder


def test_check_finds_every_problem(messy, tmp_path):
    result = check_folder(messy, CheckSettings(resolution=64), cache=tmp_path / "cache")
    groups = {g["kind"]: sorted(g["paths"]) for g in result["duplicate_groups"]}
    assert groups["exact"] == ["copy_of_0.png", "img_00000.png"]
    assert groups["near"] == ["img_00001.png", "smaller_1.jpg"]
    assert sorted(result["unreadable"]) == ["notes.png", "truncated.jpg"]
    assert "truncated" in result["messages"]["truncated.jpg"]["unreadable"]
    assert "not an image" in result["messages"]["notes.png"]["unreadable"]
    assert result["too_small"] == ["tiny.png"]
    flags = result["messages"]
    assert "exif_rotated" in flags["rotated.jpg"] and "cmyk" in flags["cmyk.jpg"]
    assert "alpha" in flags["alpha.png"] and "sixteen_bit" in flags["deep.png"]
    assert "3 frames" in flags["moving.png"]["animated"]
    assert result["extreme_aspect"] == ["wide.png"] and "wide.png" in result["crop_cuts"]
    assert set(result["uncaptioned"]) >= {"copy_of_0.png", "tiny.png"} and "img_00002.png" not in result["uncaptioned"]
    # thumbnails were made for the readable images, named by content (the two exact copies share one)
    sha = json.loads((tmp_path / "cache" / "index").glob("*.jsonl").__next__().read_text().splitlines()[0])["sha256"]
    assert Image.open(thumb_path(tmp_path / "cache", sha)).size[0] <= 256


def test_rotated_image_is_measured_upright(messy):
    result = check_folder(messy, CheckSettings(resolution=64))
    assert "rotated.jpg" not in result["extreme_aspect"]
    from trainer_backend.workbench.index import inspect_file
    record = inspect_file(messy / "rotated.jpg", messy, None)
    assert (record["width"], record["height"]) == (64, 96)   # saved 96×64 with orientation 6


def test_the_crop_preview_is_the_trainers_crop():
    """The preview's crop is data.buckets.train_crop, the function TrainDataset._crop_of calls."""
    settings = CheckSettings(resolution=64, bucketing=True, bucket_step=8)
    bucket, crop = crop_of(300, 100, settings)
    assert crop == train_crop(300, 100, bucket, True)
    left, top, right, bottom = crop.box
    assert 0 <= left < right <= 300 and 0 <= top < bottom <= 100
    import inspect as _inspect
    from trainer_backend.data import dataset
    assert "train_crop(" in _inspect.getsource(dataset.TrainDataset._crop_of)


def test_cli_check_json_and_exit_codes(messy, tmp_path):
    env_path = {"PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-m", "trainer_backend", "dataset", "check", str(messy), "--json",
                          "--resolution", "64"], capture_output=True, text=True, cwd=ROOT,
                         env={**__import__("os").environ, **env_path}, timeout=120)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    for key in ("images", "duplicates", "unreadable", "too_small", "uncaptioned"):
        assert key in result
    assert ["copy_of_0.png", "img_00000.png"] in [sorted(g) for g in result["duplicates"]]
    missing = subprocess.run([sys.executable, "-m", "trainer_backend", "dataset", "check", str(tmp_path / "nope")],
                             capture_output=True, text=True, cwd=ROOT, env={**__import__("os").environ, **env_path},
                             timeout=120)
    assert missing.returncode == 2 and "no such dataset folder" in missing.stderr
