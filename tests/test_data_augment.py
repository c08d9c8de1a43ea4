"""Per-sample augmentation (crop, flip, caption dropout, tag shuffle/dropout, keep_tokens):
reproducible from (seed, epoch, index), and class images for prior preservation."""
from __future__ import annotations

import torch

from test_data_helpers import caption, config, left_right_image, write_image
from trainer_backend.data import TrainDataset, collate, scan_dataset

TAGS = ["sks", "girl", "red hair", "smile", "outdoors", "tree", "blue sky", "hat"]


def tagged_dataset(tmp_path, n: int = 2):
    for i in range(n):
        caption(write_image(tmp_path / "d" / f"{i}.png", 96, 64, seed=i), ", ".join(TAGS))
    return tmp_path / "d"


def test_samples_are_reproducible_per_seed_epoch_and_index(tmp_path):
    data = tagged_dataset(tmp_path)
    cfg = config({"path": str(data), "repeats": 4, "flip": True, "center_crop": False, "shuffle_tags": True,
                  "keep_tokens": 1, "caption_dropout": 0.2, "tag_dropout": 0.2})
    first, second = TrainDataset(scan_dataset(cfg), cfg), TrainDataset(scan_dataset(cfg), cfg)
    for epoch in (0, 3):
        first.set_epoch(epoch)
        second.set_epoch(epoch)
        for i in reversed(range(len(first))):          # order of access does not matter
            a, b = first[i], second[i]
            assert a["caption"] == b["caption"] and a["crop_top_left"] == b["crop_top_left"]
            assert torch.equal(a["pixel_values"], b["pixel_values"])
    first.set_epoch(0)
    epoch0 = [(s["caption"], s["crop_top_left"]) for s in (first[i] for i in range(len(first)))]
    first.set_epoch(1)
    epoch1 = [(s["caption"], s["crop_top_left"]) for s in (first[i] for i in range(len(first)))]
    assert epoch0 != epoch1
    other_seed = config({"path": str(data), "repeats": 4, "flip": True, "center_crop": False,
                         "shuffle_tags": True, "keep_tokens": 1}, schedule={"seed": 99})
    ds = TrainDataset(scan_dataset(other_seed), other_seed)
    assert [ds[i]["caption"] for i in range(len(ds))] != [c for c, _ in epoch0]


def test_random_crop_moves_and_center_crop_stays(tmp_path):
    data = tagged_dataset(tmp_path, n=1)
    for center, expect_many in ((True, False), (False, True)):
        cfg = config({"path": str(data), "repeats": 30, "center_crop": center})
        ds = TrainDataset(scan_dataset(cfg), cfg)
        lefts = {ds[i]["crop_top_left"][1] for i in range(len(ds))}
        assert (len(lefts) > 3) == expect_many
        assert all(0 <= left <= 96 - 64 for left in lefts)
        if center:
            assert lefts == {16}


def test_flip_mirrors_pixels_and_the_crop_coordinate(tmp_path):
    left_right_image(tmp_path / "d" / "a.png")
    cfg = config({"path": str(tmp_path / "d"), "repeats": 40, "flip": True})
    ds = TrainDataset(scan_dataset(cfg), cfg)
    firsts = [ds[i]["pixel_values"][:, 0, 0].tolist() for i in range(len(ds))]
    reds = sum(p[0] > 0.9 and p[2] < -0.9 for p in firsts)
    blues = sum(p[2] > 0.9 and p[0] < -0.9 for p in firsts)
    assert reds + blues == 40 and 8 < blues < 32


def test_caption_dropout_keep_tokens_and_tag_dropout(tmp_path):
    data = tagged_dataset(tmp_path, n=1)
    cfg = config({"path": str(data), "repeats": 300, "caption_dropout": 0.25, "shuffle_tags": True,
                  "keep_tokens": 2, "tag_dropout": 0.3})
    ds = TrainDataset(scan_dataset(cfg), cfg)
    captions = [ds[i]["caption"] for i in range(len(ds))]
    empty = captions.count("")
    assert 45 < empty < 105                                   # ≈ 25 % of 300
    kept = [c.split(", ") for c in captions if c]
    assert all(tags[:2] == ["sks", "girl"] for tags in kept)  # keep_tokens stay first, never dropped
    assert all(set(tags) <= set(TAGS) for tags in kept)
    dropped = sum(len(TAGS) - len(tags) for tags in kept) / (len(kept) * (len(TAGS) - 2))
    assert 0.2 < dropped < 0.4                                # ≈ 30 % of the droppable tags
    assert len({tuple(t) for t in kept}) > 50


def test_static_captions_are_returned_verbatim(tmp_path):
    img = write_image(tmp_path / "d" / "a.png")
    caption(img, "a photo of sks dog,  on a beach")
    cfg = config({"path": str(tmp_path / "d")})
    ds = TrainDataset(scan_dataset(cfg), cfg)
    assert ds[0]["caption"] == "a photo of sks dog, on a beach"   # whitespace normalised, nothing else


def test_class_images_use_the_prompt_and_match_instance_samples(tmp_path):
    for i in range(2):
        caption(write_image(tmp_path / "inst" / f"{i}.png", seed=i), "photo of sks dog")
    for i in range(3):
        write_image(tmp_path / "class" / f"c{i}.png", seed=10 + i)
    cfg = config({"path": str(tmp_path / "inst"), "repeats": 5, "class_path": str(tmp_path / "class"),
                  "class_prompt": "photo of a dog"})
    scan = scan_dataset(cfg)
    assert scan.counts.class_images == 10 and scan.counts.samples_per_epoch == 20
    assert scan.summary["class_images"] == 3 and scan.summary["class_samples"] == 10
    ds = TrainDataset(scan, cfg)
    samples = [ds[i] for i in range(len(ds))]
    classes = [s for s in samples if s["is_class"]]
    assert len(classes) == 10 and all(s["caption"] == "photo of a dog" for s in classes)
    assert collate(samples[:2] + classes[:2])["is_class"].tolist() == [False, False, True, True]
    fixed = config({"path": str(tmp_path / "inst"), "repeats": 5, "class_path": str(tmp_path / "class"),
                    "class_prompt": "photo of a dog", "class_samples": 4})
    assert scan_dataset(fixed).counts.class_images == 4


def test_class_folder_that_does_not_exist_yet_is_a_warning(tmp_path):
    write_image(tmp_path / "inst" / "a.png")
    scan = scan_dataset(config({"path": str(tmp_path / "inst"), "class_path": str(tmp_path / "later")}))
    assert scan.counts.class_images == 0
    assert any("class image folder does not exist yet" in w for w in scan.warnings)


def test_dataset_follows_the_counts_the_plan_gives_it(tmp_path):
    from dataclasses import replace
    for i in range(2):
        write_image(tmp_path / "4_a" / f"{i}.png", seed=i)
    write_image(tmp_path / "2_b" / "x.png", seed=5)
    cfg = config({"path": str(tmp_path)})
    scan = scan_dataset(cfg)
    assert scan.counts.subsets == (("2_b", 1, 2), ("4_a", 2, 4))
    halved = replace(scan.counts, subsets=(("2_b", 1, 1), ("4_a", 2, 2)))   # e.g. plan.multi_counts on 2 GPUs
    ds = TrainDataset(scan, cfg, counts=halved)
    assert len(ds) == halved.samples_per_epoch == 5
    assert sorted(ds.sample_items) == sorted([0, 1, 1, 2, 2])


def test_worker_processes_give_the_same_batches_and_automatic_picks_them_only_for_a_gpu(tmp_path):
    """dataset.num_workers changes where samples are made, never what they are: the loop's loaders
    with 2 worker processes yield the very batches they yield in-process (random crop, flip,
    tag shuffle and dropout on), epoch after epoch while the next epoch's workers start ahead, and
    after skipping into an epoch as a resume does."""
    from trainer_backend.data.indexed import loader_workers
    from trainer_backend.training.epoch_loaders import EpochLoaders
    from trainer_backend.training.loop import make_sampler

    class OneProcess:
        num_processes, process_index = 1, 0

    data = tagged_dataset(tmp_path, n=3)
    batches = {}
    for workers in (0, 2):
        cfg = config({"path": str(data), "repeats": 3, "flip": True, "center_crop": False, "shuffle_tags": True,
                      "tag_dropout": 0.2, "num_workers": workers}, schedule={"batch_size": 2})
        ds = TrainDataset(scan_dataset(cfg), cfg)
        loaders = EpochLoaders(cfg, ds, make_sampler(cfg, ds, OneProcess()), epochs=4)
        batches[workers] = []
        for epoch, skip in ((0, 0), (1, 0), (2, 2), (3, 0)):
            batches[workers].append(list(loaders.epoch(epoch, skip=skip)))
            started_ahead = loaders.ahead is not None and loaders.ahead[0] == epoch + 1
            assert started_ahead == (workers > 0 and epoch < 3), (workers, epoch)  # the next epoch's workers run
            if started_ahead:
                assert all(w.is_alive() for w in loaders.ahead[1]._workers)
        loaders.close()
    assert len(batches[2]) == len(batches[0]) == 4
    for with_workers, in_process in zip(batches[2], batches[0]):
        assert len(with_workers) == len(in_process) > 0
        for a, b in zip(with_workers, in_process):
            assert a["caption"] == b["caption"] and a["index"] == b["index"]
            assert torch.equal(a["pixel_values"], b["pixel_values"])

    assert loader_workers(3, False, False) == 3                      # an explicit count is kept
    assert loader_workers(-1, False, False, cpu_count=16) == 0        # a CPU run keeps its cores
    assert loader_workers(-1, True, True, cpu_count=16) == 0        # cached latents: nothing to decode
    assert loader_workers(-1, True, False, num_processes=1, cpu_count=16) == 4
    assert loader_workers(-1, True, False, num_processes=8, cpu_count=16) == 1
    assert loader_workers(-1, True, False, num_processes=2, cpu_count=2) == 0
