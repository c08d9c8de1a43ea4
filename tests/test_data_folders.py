"""Folder datasets: kohya N_concept layout, flat folders, caption files, subsets, errors."""
from __future__ import annotations

import pytest
import torch

from test_data_helpers import caption, config, left_right_image, write_image
from trainer_backend.config import ConfigError
from trainer_backend.data import TrainDataset, collate, scan_dataset


def test_kohya_layout_repeats_class_tokens_and_captions(tmp_path):
    root = tmp_path / "train"
    a = write_image(root / "3_sks dog" / "a.png", seed=1)
    write_image(root / "3_sks dog" / "b.png", seed=2)
    caption(a, "sks dog on a sofa")
    s = write_image(root / "1_style" / "s.jpg", seed=3)
    caption(s, "should not be read")                   # wrong extension for this run
    caption(s, "watercolor style", ".caption")
    write_image(root / "not_a_concept" / "x.png", seed=4)
    cfg = config({"path": str(root), "caption_extension": ".caption"})
    scan = scan_dataset(cfg)

    assert scan.counts.subsets == (("1_style", 1, 1), ("3_sks dog", 2, 3))
    captions = {item.path.name: item.caption for item in scan.items}
    # a.png has only a .txt caption, so with .caption it falls back to the class tokens
    assert captions == {"a.png": "sks dog", "b.png": "sks dog", "s.jpg": "watercolor style"}
    assert scan.summary["missing_captions"] == 2
    assert any("not_a_concept" in w and "ignored" in w for w in scan.warnings)
    assert any("2 of 2 images have no .caption caption; using 'sks dog'" in w for w in scan.warnings)
    assert scan.summary["samples_per_epoch"] == 7
    assert len(TrainDataset(scan, cfg)) == 7


def test_txt_captions_and_flat_folder_with_repeats(tmp_path):
    root = tmp_path / "flat"
    for i in range(3):
        img = write_image(root / "sub" / f"{i}.png", seed=i)   # nested folders are part of a flat dataset
        caption(img, f"caption number {i}\n")
    cfg = config({"path": str(root), "repeats": 4})
    scan = scan_dataset(cfg)
    assert scan.counts.subsets == (("flat", 3, 4),)
    assert sorted(i.caption for i in scan.items) == ["caption number 0", "caption number 1", "caption number 2"]
    assert scan.warnings == []
    ds = TrainDataset(scan, cfg)
    assert len(ds) == 12
    # every image appears exactly `repeats` times
    assert sorted(ds.sample_items) == sorted(list(range(3)) * 4)


def test_subset_folder_named_like_a_concept_takes_its_repeats(tmp_path):
    write_image(tmp_path / "5_cat" / "c.png")
    scan = scan_dataset(config({"subsets": [{"path": str(tmp_path / "5_cat")}]}))
    assert scan.counts.subsets == (("5_cat", 1, 5),)
    assert scan.items[0].caption == "cat"


def test_subsets_have_their_own_repeats_captions_and_flip(tmp_path):
    subject = tmp_path / "subject"
    style = tmp_path / "style"
    left_right_image(subject / "s.png")
    caption(subject / "s.png", "sks person")
    left_right_image(style / "t.png")
    caption(style / "t.png", "ink style", ".caption")
    cfg = config({"path": str(subject), "repeats": 2, "flip": True,
                  "subsets": [{"path": str(style), "repeats": 3, "caption_extension": ".caption", "flip": False}]})
    scan = scan_dataset(cfg)
    assert scan.counts.subsets == (("subject", 1, 2), ("style", 1, 3))
    ds = TrainDataset(scan, cfg)
    red_left = {"subject": set(), "style": set()}
    for epoch in range(8):
        ds.set_epoch(epoch)
        for i in range(len(ds)):
            sample = ds[i]
            name = "subject" if sample["caption"] == "sks person" else "style"
            assert sample["caption"] == {"subject": "sks person", "style": "ink style"}[name]
            red_left[name].add(bool(sample["pixel_values"][0, 32, 0] > 0.5))
    assert red_left["style"] == {True}            # flip = false for this subset: never flipped
    assert red_left["subject"] == {True, False}   # inherited flip = true: flipped some epochs


def test_missing_empty_and_unusable_dataset_stop_with_the_key(tmp_path):
    with pytest.raises(ConfigError, match=r"^dataset\.path: folder not found"):
        scan_dataset(config({"path": str(tmp_path / "nope")}))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match=r"^dataset\.path: no images found"):
        scan_dataset(config({"path": str(tmp_path / "empty")}))
    write_image(tmp_path / "ok" / "a.png")
    with pytest.raises(ConfigError, match=r"^dataset\.subsets\[0\]\.path: folder not found"):
        scan_dataset(config({"path": str(tmp_path / "ok"), "subsets": [{"path": str(tmp_path / "gone")}]}))
    with pytest.raises(ConfigError, match=r"^dataset\.path: no dataset given"):
        scan_dataset(config({}))


def test_batch_from_collate_has_the_documented_shapes(tmp_path):
    for i in range(2):
        write_image(tmp_path / "d" / f"{i}.png", width=80, height=64, seed=i)
    cfg = config({"path": str(tmp_path / "d")})
    ds = TrainDataset(scan_dataset(cfg), cfg)
    batch = collate([ds[0], ds[1]])
    assert batch["pixel_values"].shape == (2, 3, 64, 64) and batch["pixel_values"].dtype == torch.float32
    assert -1.0 <= batch["pixel_values"].min() and batch["pixel_values"].max() <= 1.0
    assert batch["original_size"].tolist() == [[64, 80], [64, 80]]
    assert batch["target_size"].tolist() == [[64, 64], [64, 64]]
    assert batch["crop_top_left"].tolist() == [[0, 8], [0, 8]]     # centre crop of 80 -> 64
    assert batch["is_class"].tolist() == [False, False]
    assert batch["caption"] == ["", ""]
