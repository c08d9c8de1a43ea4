"""Bad input never stops a run: each bad file gets exactly one warning naming it, is skipped or
repaired, and is counted in the summary; only a dataset with nothing usable left is an error."""
from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from test_data_helpers import caption, config, write_image
from trainer_backend.config import ConfigError
from trainer_backend.data import TrainDataset, scan_dataset


def png_header_only(path: Path, width: int, height: int) -> None:
    """A PNG whose header claims width×height but holds almost no data (decompression bomb)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64))
                     + chunk(b"IEND", b""))


def noise_png(path: Path, size: int = 64) -> Path:
    arr = np.random.default_rng(0).integers(0, 255, (size, size, 3), dtype=np.uint8)
    Image.fromarray(arr).save(path)
    return path


BAD = {  # file -> summary kind
    "truncated.png": "corrupt", "corrupt.png": "corrupt", "text.jpg": "not_image", "tiny.png": "too_small",
    "bomb.png": "enormous", "dangling.png": "unreadable", "loop_a.png": "unreadable", "loop_b.png": "unreadable",
    "loop": "symlink_loop",
}
REPAIRED = {"cmyk.jpg": "cmyk", "gray16.png": "16_bit", "palette.png": "palette", "alpha.png": "alpha",
            "rotated.jpg": "exif_rotated"}


@pytest.fixture
def messy(tmp_path) -> Path:
    root = tmp_path / "messy"
    root.mkdir()
    for i in range(2):
        caption(write_image(root / f"good{i}.png", seed=i), f"good image {i}")
    data = noise_png(root / "truncated.png").read_bytes()
    (root / "truncated.png").write_bytes(data[: len(data) // 2])
    data = bytearray(noise_png(root / "corrupt.png").read_bytes())
    data[100:400] = bytes(300)                        # zeroed compressed pixel data
    (root / "corrupt.png").write_bytes(bytes(data))
    (root / "text.jpg").write_text("this is not a jpeg")
    write_image(root / "tiny.png", 16, 16)            # smallest bucket side at resolution 64 is 32
    png_header_only(root / "bomb.png", 30000, 30000)
    os.symlink(root / "does-not-exist.png", root / "dangling.png")
    os.symlink(root / "loop_b.png", root / "loop_a.png")
    os.symlink(root / "loop_a.png", root / "loop_b.png")
    os.symlink(root, root / "loop")                   # folder symlink to itself: must not recurse forever

    red = Image.new("RGB", (64, 64), (255, 0, 0))
    red.convert("CMYK").save(root / "cmyk.jpg", quality=95)
    Image.fromarray(np.full((64, 64), 128 * 257, np.uint16)).save(root / "gray16.png")
    Image.new("RGB", (64, 64), (0, 200, 0)).convert("P", palette=Image.Palette.ADAPTIVE).save(root / "palette.png")
    rgba = np.zeros((64, 64, 4), np.uint8)
    rgba[:, 32:] = (0, 0, 255, 255)                   # left half fully transparent
    Image.fromarray(rgba, "RGBA").save(root / "alpha.png")
    exif = Image.Exif()
    exif[0x0112] = 6                                  # "rotate 90° clockwise to display"
    write_image(root / "rotated.jpg", width=96, height=64, fmt="JPEG", exif=exif)

    caption(write_image(root / "empty_caption.png", seed=7), "  \n ")
    write_image(root / "latin1.png", seed=8).with_suffix(".txt").write_bytes("café au lait".encode("latin-1"))
    return root


def test_every_bad_file_is_warned_once_skipped_or_repaired_and_counted(messy):
    cfg = config({"path": str(messy)})
    scan = scan_dataset(cfg)

    usable = {item.path.name for item in scan.items}
    assert usable == {"good0.png", "good1.png", "empty_caption.png", "latin1.png", *REPAIRED}
    skipped = {Path(s["file"]).name: s["kind"] for s in scan.summary["skipped"]}
    assert skipped == BAD
    assert scan.summary["skipped_by_kind"] == {"corrupt": 2, "not_image": 1, "too_small": 1, "enormous": 1,
                                               "unreadable": 3, "symlink_loop": 1}
    repaired = {Path(r["file"]).name: r["note"] for r in scan.summary["repaired"]}
    assert set(repaired) == set(REPAIRED)
    assert scan.summary["repaired_by_kind"] == {kind: 1 for kind in REPAIRED.values()}
    assert "white background" in repaired["alpha.png"] and "CMYK" in repaired["cmyk.jpg"]

    for name in [*BAD, *REPAIRED, "empty_caption.png", "latin1.png"]:
        mentions = [w for w in scan.warnings if f"{os.sep}{name}:" in w]
        assert len(mentions) == 1, (name, mentions)
    assert any("latin1.txt is not UTF-8" in w for w in scan.warnings)
    assert any("empty_caption.txt is empty" in w for w in scan.warnings)
    assert any("bomb.png" in w and "900 megapixels" in w and "decompression-bomb" in w for w in scan.warnings)


def test_repaired_images_train_as_8_bit_rgb(messy):
    cfg = config({"path": str(messy)})
    scan = scan_dataset(cfg)
    ds = TrainDataset(scan, cfg)
    by_name = {scan.items[k].path.name: ds[i] for i, k in enumerate(ds.sample_items)}

    alpha = by_name["alpha.png"]["pixel_values"]
    assert torch_close(alpha[:, 10, 5], [1.0, 1.0, 1.0])           # transparent -> white
    assert torch_close(alpha[:, 10, 60], [-1.0, -1.0, 1.0])        # opaque blue stays blue
    gray = by_name["gray16.png"]["pixel_values"]
    assert abs(float(gray.mean()) - (128 / 127.5 - 1)) < 0.01      # scaled, not clipped to white
    cmyk = by_name["cmyk.jpg"]["pixel_values"][:, 32, 32]
    assert cmyk[0] > 0.8 and cmyk[1] < -0.8 and cmyk[2] < -0.8
    rotated = by_name["rotated.jpg"]
    assert rotated["original_size"] == (96, 64)                    # (h, w) after the EXIF rotation
    assert by_name["latin1.png"]["caption"] == "caf\ufffd au lait"
    assert by_name["empty_caption.png"]["caption"] == ""


def torch_close(values, expected, tol=0.02) -> bool:
    return all(abs(float(v) - e) < tol for v, e in zip(values, expected))


def test_a_file_that_breaks_after_the_scan_is_replaced_not_fatal(tmp_path):
    for i in range(3):
        write_image(tmp_path / "d" / f"{i}.png", seed=i)
    cfg = config({"path": str(tmp_path / "d")})
    ds = TrainDataset(scan_dataset(cfg), cfg)
    (tmp_path / "d" / "1.png").write_bytes(b"gone bad")
    samples = [ds[i] for i in range(len(ds))]
    assert all(s["pixel_values"].shape == (3, 64, 64) for s in samples)


def test_nothing_usable_left_stops_with_the_reasons(tmp_path):
    root = tmp_path / "bad"
    root.mkdir()
    (root / "a.png").write_text("nope")
    write_image(root / "b.png", 8, 8)
    with pytest.raises(ConfigError, match=r"^dataset\.path: no usable image left .*1 not image, 1 too small"):
        scan_dataset(config({"path": str(root)}))


def test_enormous_limit_is_configurable(tmp_path):
    write_image(tmp_path / "d" / "big.png", 256, 256)
    write_image(tmp_path / "d" / "ok.png", 64, 64)
    scan = scan_dataset(config({"path": str(tmp_path / "d"), "max_image_megapixels": 0.01}))
    assert [i.path.name for i in scan.items] == ["ok.png"]
    assert scan.summary["skipped_by_kind"] == {"enormous": 1}
