"""Metadata JSON mode: every filter and transform, the validation split, malformed input."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from test_data_helpers import config, write_image
from trainer_backend.data import TrainDataset, scan_dataset


def record(root: Path, name: str, tags: list[str], score: float | None = 100, folder: str = "meta", **extra) -> None:
    """An image under root/img/ and its JSON record under root/<folder>/ (path relative to root)."""
    write_image(root / "img" / f"{name}.png", seed=len(name) + sum(map(ord, name)))
    data = {"tags": tags, "path": f"img/{name}.png", **extra}
    if score is not None:
        data["score"] = score
    target = root / folder / f"{name}.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(data))


def meta_config(root: Path, **dataset):
    return config({"path": str(root), "source": "metadata", **dataset})


def captions(scan) -> dict[str, str]:
    return {item.path.stem: item.caption for item in scan.items}


def test_tags_become_the_caption_and_extra_keys_are_ignored(tmp_path):
    record(tmp_path, "a", ["solo", "oc only", "blue sky"], uploader="someone", id=5)
    record(tmp_path, "b", ["duo"], folder="meta/deeper/tree")
    scan = scan_dataset(meta_config(tmp_path))
    assert captions(scan) == {"a": "solo, oc only, blue sky", "b": "duo"}
    assert scan.counts.subsets == ((tmp_path.name, 2, 1),)
    assert scan.warnings == []


def test_ignore_remove_replace_and_separator(tmp_path):
    record(tmp_path, "keep", ["princess luna", "artist:someone", "high res", "solo"])
    record(tmp_path, "drop", ["solo", "animated"])
    cfg = meta_config(tmp_path, ignore_tags=["animated"], remove_tags=["high res"],
                      replace_tags={"princess luna": "luna", "artist:": "by=", " ": "_"}, tag_separator=" ")
    scan = scan_dataset(cfg)
    assert captions(scan) == {"keep": "luna by=someone solo"}
    assert scan.summary["filtered_by"] == {"ignore_tags": 1}


def test_absolute_and_bonus_adjusted_minimum_scores(tmp_path):
    record(tmp_path, "low", ["solo"], score=40)                  # below abs_min_score: out regardless of bonus
    record(tmp_path, "mono", ["monochrome"], score=250)          # 250 - 75 = 175 < 200: out
    record(tmp_path, "solo", ["solo"], score=120)                # 120 + 100 = 220: in
    record(tmp_path, "plain", ["landscape"], score=210)          # 210: in
    record(tmp_path, "noscore", ["landscape"], score=None)       # no score counts as 0: out
    cfg = meta_config(tmp_path, abs_min_score=50, min_score=200,
                      tag_bonus_scores={"solo": 100, "monochrome": -75})
    scan = scan_dataset(cfg)
    assert sorted(captions(scan)) == ["plain", "solo"]
    assert scan.summary["filtered_by"] == {"abs_min_score": 2, "min_score": 1}


def test_score_tags_add_the_highest_threshold_exceeded(tmp_path):
    record(tmp_path, "s900", ["x"], score=900)
    record(tmp_path, "s800", ["x"], score=800)                   # not > 800
    record(tmp_path, "s10", ["x"], score=10)
    scan = scan_dataset(meta_config(tmp_path, score_tags=[200, 800, 3200, 400]))
    assert captions(scan) == {"s900": "x, scr800", "s800": "x, scr400", "s10": "x"}


def test_shuffle_probability_and_keep_tokens(tmp_path):
    tags = ["character", "t1", "t2", "t3", "t4", "t5"]
    record(tmp_path, "a", tags)
    cfg = meta_config(tmp_path, shuffle_tags=True, shuffle_tags_p=0.5, keep_tokens=1, repeats=200)
    ds = TrainDataset(scan_dataset(cfg), cfg)
    seen = [ds[i]["caption"].split(", ") for i in range(len(ds))]
    assert all(c[0] == "character" and sorted(c) == sorted(tags) for c in seen)
    shuffled = sum(c != tags for c in seen)
    # about half are shuffled (a shuffle can reproduce the original order, 1/120)
    assert 60 < shuffled < 140


def test_validation_split_holds_out_every_nth_file(tmp_path):
    for i in range(9):
        record(tmp_path, f"r{i}", [f"tag{i}"])
    cfg = meta_config(tmp_path, validation_every_nth=3)
    train = {item.path.stem for item in scan_dataset(cfg).items}
    held = {item.path.stem for item in scan_dataset(cfg, split="validation").items}
    assert held == {"r2", "r5", "r8"}
    assert train == {f"r{i}" for i in range(9)} - held
    assert scan_dataset(cfg).summary["validation_images"] == 3


def test_single_json_file_with_a_list_and_records_without_path(tmp_path):
    write_image(tmp_path / "pics" / "one.png", seed=1)
    write_image(tmp_path / "pics" / "two.png", seed=2)
    listing = tmp_path / "all.json"
    listing.write_text(json.dumps([{"tags": ["first"], "path": "pics/one.png"},
                                   {"tags": "second, more", "path": "pics/two.png"}]))
    scan = scan_dataset(meta_config(tmp_path, metadata_path=str(listing)))
    assert captions(scan) == {"one": "first", "two": "second, more"}
    # a record without "path" uses the same-named image next to its JSON file
    beside = tmp_path / "beside"
    write_image(beside / "pic.png")
    (beside / "pic.json").write_text(json.dumps({"tags": ["next to it"], "score": 3}))
    assert captions(scan_dataset(meta_config(beside))) == {"pic": "next to it"}


def test_malformed_json_and_paths_outside_the_root_are_skipped_with_a_warning(tmp_path):
    root = tmp_path / "root"
    record(root, "good", ["fine"])
    (root / "meta" / "broken.json").write_text("{not json")
    (root / "meta" / "wrongtype.json").write_text(json.dumps({"tags": 5, "path": "img/good.png"}))
    write_image(tmp_path / "secret.png")
    (root / "meta" / "escape.json").write_text(json.dumps({"tags": ["x"], "path": "../secret.png"}))
    (root / "meta" / "absolute.json").write_text(json.dumps({"tags": ["x"], "path": str(tmp_path / "secret.png")}))
    (root / "meta" / "missing.json").write_text(json.dumps({"tags": ["x"], "path": "img/nothere.png"}))
    scan = scan_dataset(meta_config(root))
    assert captions(scan) == {"good": "fine"}
    text = "\n".join(scan.warnings)
    for name, why in [("broken.json", "not valid JSON"), ("wrongtype.json", "'tags' is not a list"),
                      ("escape.json", "outside the dataset root"), ("absolute.json", "absolute"),
                      ("missing.json", "image not found")]:
        assert any(name in w and why in w for w in scan.warnings), (name, text)
    kinds = Counter(s["kind"] for s in scan.summary["skipped"])
    assert kinds == {"metadata": 5}
