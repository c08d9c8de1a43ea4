"""Qwen-Image 2.1 generates and edits with one model: one dataset holds edit pairs (images with a
control image) and caption-only images. The scan keeps both kinds, batches never stack the two, the
caption-only images' text is cached while the pairs' text (read with the control image) is encoded each
step, and every batch's loss equals the mean of its samples' losses computed one by one without any cache
(the per-kind computation); a run on such a dataset trains both kinds to the end."""
from __future__ import annotations

import shutil

import pytest
import torch

from conftest import make_dataset
from method_runs import train_run
from trainer_backend.config import load_config
from trainer_backend.families import load_model


@pytest.fixture(scope="module")
def tiny(tiny_models):
    folder = tiny_models("qwen_image21")
    return folder, load_model(str(folder))


def _mixed(tmp_path):
    """4 images; img000 and img002 have control images (the same names in control/), the others not."""
    data = make_dataset(tmp_path / "data", n=4, size=64)
    make_dataset(tmp_path / "all_controls", n=4, size=64, seed=7)
    control = tmp_path / "control"
    control.mkdir()
    for name in ("img000.png", "img002.png"):
        shutil.copy(tmp_path / "all_controls" / name, control / name)
    return data, control


def _cfg(folder, data, control, arch="qwen_image21", *extra):
    return load_config(None, [f"model.path={folder}", f"model.arch={arch}", f"dataset.path={data}",
                              f"dataset.control_path={control}", "dataset.resolution=64", "schedule.batch_size=2",
                              "hardware.cpu=true", "precision.mixed=no", *extra])


def test_the_scan_keeps_caption_only_images_beside_pairs_and_batches_never_mix_them(tmp_path, tiny):
    from trainer_backend.config.rules import problems
    from trainer_backend.data import TrainDataset, scan_dataset
    from trainer_backend.data.sampler import BucketBatchSampler
    folder, _ = tiny
    data, control = _mixed(tmp_path)
    cfg = _cfg(folder, data, control)
    assert not [p for p in problems(cfg) if "control" in p.key]
    scan = scan_dataset(cfg)
    assert (scan.summary["images"], scan.summary["control_images"], scan.summary["caption_only_images"]) == (4, 2, 2)
    assert not scan.summary["missing_controls"]
    assert any("train on their captions alone" in w for w in scan.warnings)
    dataset = TrainDataset(scan, cfg)
    kinds = set()
    for epoch in range(3):
        sampler = BucketBatchSampler(dataset.sample_buckets, 2, seed=epoch)
        for batch in sampler:
            paired = {dataset.items[dataset.sample_items[i]].control is not None for i in batch}
            assert len(paired) == 1, "a batch stacked an edit pair with a caption-only image"
            kinds |= paired
    assert kinds == {True, False}
    # an edit-only model (control_images = "required") still skips an image without its control image
    edit_only = scan_dataset(_cfg(folder, data, control, "qwen_image_edit"))
    assert edit_only.summary["images"] == 2 and edit_only.summary["missing_controls"] == 2


@pytest.mark.parametrize("latents", [False, True], ids=["pixels", "cached-latents"])
def test_each_batch_of_a_mixed_dataset_trains_as_its_samples_would_alone(tmp_path, tiny, latents):
    """Without cached latents the pairs' text is encoded each step (their control images are cropped and
    flipped per step); with them, each pair's text is cached per orientation, read with its control image."""
    from trainer_backend.data import TrainDataset
    from trainer_backend.data.indexed import collate_with_index
    from trainer_backend.data.sampler import BucketBatchSampler
    from trainer_backend.diffusion.loss import diffusion_loss
    from trainer_backend.diffusion.posterior import encode_posterior
    from trainer_backend.training.setup import cache_pair_text, cache_text_outputs, scan_data
    folder, model = tiny
    data, control = _mixed(tmp_path)
    cfg = _cfg(folder, data, control, "qwen_image21", "dataset.cache_text_encoder_outputs=true",
               "dataset.flip=true", "dataset.cache_both_flips=true")
    scan = scan_data(cfg, model.family)
    cached, plain = TrainDataset(scan, cfg), TrainDataset(scan, cfg)
    if latents:
        for dataset in (cached, plain):
            dataset.cache_latents(lambda pixels: encode_posterior(model, pixels), None, progress=False)
    cache_text_outputs(cfg, cached, model)
    cache_pair_text(cfg, cached, model)
    covered = {cached.items[cached.sample_items[i]].control is None: "text" in cached[i] for i in range(len(cached))}
    assert covered == {True: True, False: latents}  # caption-only texts cached; the pairs' with cached latents

    def loss(dataset, indices):
        batch = collate_with_index([(i, dataset[i]) for i in indices])
        with torch.no_grad():
            return diffusion_loss(model, model.denoiser, batch, cfg=cfg, epoch=0, device=torch.device("cpu"),
                                  weight_dtype=torch.float32)
    seen = set()
    for batch in BucketBatchSampler(cached.sample_buckets, 2, seed=0):
        alone = torch.stack([loss(plain, [i]) for i in batch]).mean()
        torch.testing.assert_close(loss(cached, batch), alone, rtol=1e-5, atol=1e-6)
        seen.add(cached.items[cached.sample_items[batch[0]]].control is not None)
    assert seen == {True, False}


def test_a_run_on_pairs_and_captions_trains_both_kinds(tmp_path, tiny):
    folder, _ = tiny
    data, control = _mixed(tmp_path)
    run, events, _ = train_run(tmp_path, folder, data, "mixed", "schedule.max_steps=2", "dataset.resolution=64",
                               "schedule.batch_size=2", f"dataset.control_path={control}",
                               "dataset.cache_text_encoder_outputs=true")
    assert [e["event"] for e in events][-1] == "done"
    steps = [e for e in events if e["event"] == "step"]
    assert len(steps) == 2 and all(e["loss"] > 0 for e in steps)  # one epoch: one batch of each kind
    assert (run / "mixed.safetensors").is_file()
    log = (run / "train.log").read_text()
    assert "captions of the images without a control image" in log
