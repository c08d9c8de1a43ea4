"""DreamBooth with prior preservation: class images generated when missing (seeded, cached
outside the dataset, reused), instance and class samples in every batch, both loss parts in
the step events, and an output that loads."""
import math

import torch
from PIL import Image

from conftest import make_dataset
from method_runs import train_run, unet_probe
from trainer_backend.data.sampler import BucketBatchSampler
from trainer_backend.methods.dreambooth import PairedBatchSampler


def test_paired_batches_hold_both_kinds_and_keep_the_plan():
    """Every batch of 2+ holds instance and class samples, on 1 or 2 processes; batch counts
    equal the plain sampler's (what plan.py counts) and every sample is seen once per epoch."""
    buckets = [0] * 10 + [1] * 6
    is_class = [False] * 5 + [True] * 5 + [False] * 3 + [True] * 3
    for processes in (1, 2):
        per_rank = [PairedBatchSampler(buckets, is_class, 2, num_processes=processes, process_index=r, seed=7)
                    for r in range(processes)]
        plain = BucketBatchSampler(buckets, 2, num_processes=processes, seed=7)
        for epoch in range(3):
            seen = []
            for sampler in per_rank:
                batches = sampler.batches(epoch)
                assert len(batches) == len(plain.batches(epoch))
                for batch in batches:  # a short last global batch may leave a process 1 sample
                    assert len(batch) == 1 or len({is_class[i] for i in batch}) == 2, batch
                    assert len({buckets[i] for i in batch}) == 1
                seen += [i for b in batches for i in b]
            assert sorted(set(seen)) == list(range(16))
        assert per_rank[0].batches(1) == PairedBatchSampler(buckets, is_class, 2, num_processes=processes,
                                                            seed=7).batches(1)  # deterministic


def _run(tmp_path, model_dir, data, name, *extra):
    return train_run(tmp_path, model_dir, data, name, "schedule.max_steps=2", "schedule.batch_size=2",
                     "dataset.num_class_images=3", 'dataset.class_prompt="a photo of a square"',
                     "dataset.class_generation_steps=1", "dataset.class_generation_batch_size=2",
                     "dataset.prior_loss_weight=0.5", "optimizer.lr=1e-2", *extra)


def test_prior_preservation_sd1(tmp_path, tiny_models):
    from trainer_backend.families.sd.loader import build_pipeline, load_model
    model_dir = tiny_models("sd1")
    data = make_dataset(tmp_path / "data", n=2, size=32)
    before = sorted(p.name for p in data.iterdir())
    run, events, _ = _run(tmp_path, model_dir, data, "db1")

    (gen,) = [e for e in events if e["event"] == "class_images"]
    assert (gen["wanted"], gen["generated"], gen["reused"]) == (3, 3, 0)
    cache = tmp_path / "runs" / ".cache" / "class_images"
    images = sorted(p for p in cache.rglob("class-*.png"))
    assert [p.name for p in images] == ["class-00000.png", "class-00001.png", "class-00002.png"]
    assert all(Image.open(p).size == (32, 32) for p in images)
    assert sorted(p.name for p in data.iterdir()) == before  # the dataset is never written to
    plan = next(e for e in events if e["event"] == "plan")
    assert plan["class_images"] == 2  # class samples per epoch = instance samples

    steps = [e for e in events if e["event"] == "step"]
    assert len(steps) == 2
    for e in steps:  # batch 2 = 1 instance + 1 class sample; the class one weighted 0.5
        assert math.isclose(e["loss"], (e["loss_instance"] + 0.5 * e["loss_prior"]) / 2, rel_tol=1e-5)

    pipe = build_pipeline(load_model(str(model_dir)))
    base = unet_probe(pipe.unet)
    pipe.load_lora_weights(str(run / "db1.safetensors"))
    assert (unet_probe(pipe.unet) - base).abs().max() > 1e-4

    # Next run, same settings: the cache is reused; a deleted image is regenerated identically.
    removed = Image.open(images[1]).convert("RGB")
    images[1].unlink()
    mtimes = {p: p.stat().st_mtime_ns for p in (images[0], images[2])}
    _, events2, _ = _run(tmp_path, model_dir, data, "db2")
    (gen2,) = [e for e in events2 if e["event"] == "class_images"]
    assert (gen2["generated"], gen2["reused"], gen2["folder"]) == (1, 2, gen["folder"])
    assert {p: p.stat().st_mtime_ns for p in mtimes} == mtimes
    again = Image.open(images[1]).convert("RGB")
    diff = torch.tensor(list(again.getdata())) - torch.tensor(list(removed.getdata()))
    assert diff.abs().max() <= 1  # seeded per image: batch composition does not matter
    # and training on the cached images is the same as on the freshly generated ones
    for a, b in zip([e["loss"] for e in events2 if e["event"] == "step"], [e["loss"] for e in steps]):
        assert math.isclose(a, b, rel_tol=1e-3)


def test_plan_before_class_images_exist_is_what_runs(tmp_path, tiny_models):
    """The plan the CLI/GUI show before the missing class images are generated counts them (their
    samples and their square bucket), so it matches the plan the run writes and the steps it makes."""
    from trainer_backend.config import load_config
    from trainer_backend.config.checks import validate_for_run
    from trainer_backend.data import scan_dataset
    from trainer_backend.launch.plan import plan_from_config
    model_dir = tiny_models("sd1")
    data = tmp_path / "data"
    data.mkdir()
    for i, size in enumerate([(64, 24)] * 3):  # wide: not the generated images' bucket
        Image.new("RGB", size, (40 * i, 90, 200)).save(data / f"img{i}.png")
        (data / f"img{i}.txt").write_text("a wide box")
    user_class = tmp_path / "class"
    user_class.mkdir()
    Image.new("RGB", (64, 24), (9, 9, 9)).save(user_class / "mine.png")
    settings = ["schedule.epochs=1", "schedule.batch_size=2", "dataset.bucketing=true", "dataset.bucket_step=16",
                "dataset.bucket_min_side=16", "dataset.bucket_max_side=64", f"dataset.class_path={user_class}",
                "optimizer.lr=1e-2"]
    cfg = validate_for_run(load_config(None, [
        f"model.path={model_dir}", f"dataset.path={data}", "dataset.resolution=32",
        f"output.dir={tmp_path / 'runs'}", "dataset.num_class_images=3", 'dataset.class_prompt="a box"',
        *settings]))
    scan = scan_dataset(cfg)
    assert scan.summary["class_images_to_generate"] == 2 and scan.summary["class_images"] == 3
    before = plan_from_config(cfg, scan.counts).to_dict()
    assert before["class_images"] == 3  # class samples per epoch = instance samples
    assert len(scan.counts.bucket_sizes) == 2  # wide instance + user class, square generated ones

    _, events, _ = _run(tmp_path, model_dir, data, "planned", "schedule.max_steps=0", *settings)
    during = next(e for e in events if e["event"] == "plan")
    assert during["multi"] == before["multi"] and during["class_images"] == before["class_images"]
    assert len([e for e in events if e["event"] == "step"]) == before["multi"]["total_steps"]
