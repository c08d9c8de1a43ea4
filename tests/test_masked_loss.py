"""Masked loss (loss.masked): a mask from the image's alpha channel or a mask folder weights the
loss per latent pixel; the masked-out part contributes nothing, the mask stays on its pixels
through crop and flip (cached latents too), and a masked run trains."""
from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from PIL import Image

from conftest import make_dataset
from method_runs import train_run
from test_data_helpers import caption, config
from trainer_backend.config import ConfigError
from trainer_backend.data import TrainDataset, collate, scan_dataset
from trainer_backend.diffusion.loss import per_sample_loss


def half_mask(height: int, width: int) -> torch.Tensor:
    mask = torch.ones(1, 1, height, width)
    mask[..., width // 2:] = 0
    return mask


def test_the_masked_half_gets_exactly_no_gradient_and_the_loss_is_the_kept_halfs():
    g = torch.Generator().manual_seed(0)
    pred = torch.randn(2, 4, 8, 8, generator=g, requires_grad=True)
    target = torch.randn(2, 4, 8, 8, generator=g)
    loss = per_sample_loss(pred, target, half_mask(64, 64).expand(2, 1, 64, 64))  # pixel mask, 8× the latents
    kept = ((pred[..., :4] - target[..., :4]) ** 2).mean(dim=(1, 2, 3))
    torch.testing.assert_close(loss, kept)   # normalised by the mask mean: the kept half's own mean
    loss.sum().backward()
    assert torch.count_nonzero(pred.grad[..., 4:]) == 0
    assert torch.count_nonzero(pred.grad[..., :4]) == pred.grad[..., :4].numel()
    # without a mask, and with a mask of ones, the loss is the plain mean
    torch.testing.assert_close(per_sample_loss(pred, target, torch.ones(2, 1, 64, 64)), per_sample_loss(pred, target))


def red_left_transparent_right(path, width=48, height=32):
    """Opaque red on the left half, fully transparent blue on the right (composited to white)."""
    arr = np.zeros((height, width, 4), np.uint8)
    arr[:, : width // 2] = (255, 0, 0, 255)
    arr[:, width // 2:] = (0, 0, 255, 0)
    Image.fromarray(arr, "RGBA").save(path)
    caption(path, "red")
    return path


def masked_config(data, **dataset):
    return config({"path": str(data), "resolution": 32, "flip": True, "center_crop": False, **dataset},
                  loss={"masked": True})


def test_the_alpha_mask_follows_random_crops_and_flips(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    red_left_transparent_right(data / "a.png")
    cfg = masked_config(data, repeats=8)
    dataset = TrainDataset(scan_dataset(cfg), cfg)
    seen = set()
    for epoch in range(3):
        dataset.set_epoch(epoch)
        for i in range(len(dataset)):
            sample = dataset[i]
            red = sample["pixel_values"][0] > 0.9          # red channel: 1 on red and white, -1 nowhere
            white = sample["pixel_values"][1] > 0.9        # green: only the composited white
            mask = sample["mask"][0]
            assert torch.equal(mask == 1, red & ~white) and torch.equal(mask == 0, white)
            seen.add((int(mask[0, 0]), int(mask[0, -1])))  # which side the red half is on after crop/flip
    assert {(1, 0), (0, 1)} <= seen
    batch = collate([dataset[0], dataset[1]])
    assert batch["mask"].shape == (2, 1, 32, 32)


def test_mask_folder_by_stem_and_missing_masks_train_with_full_weight(tmp_path, caplog):
    data, masks = tmp_path / "data", tmp_path / "masks"
    make_dataset(data, n=2, size=32)
    masks.mkdir()
    mask = np.zeros((16, 16), np.uint8)
    mask[:, :8] = 255                                     # half the size of the image: resized to it
    Image.fromarray(mask, "L").save(masks / "img000.webp")
    cfg = config({"path": str(data), "resolution": 32, "mask_path": str(masks)}, loss={"masked": True})
    with caplog.at_level(logging.WARNING):
        dataset = TrainDataset(scan_dataset(cfg), cfg)
    assert "1 of 2 images have no mask" in caplog.text
    first, second = (dataset[i]["mask"][0] for i in range(2))
    assert first[:, :15].min() == 1 and first[:, 17:].max() == 0
    assert torch.equal(second, torch.ones(32, 32))
    inside = config({"path": str(data), "resolution": 32, "mask_path": str(data)}, loss={"masked": True})
    with pytest.raises(ConfigError, match="dataset.mask_path: .* inside the dataset folder"):
        TrainDataset(scan_dataset(inside), inside)


def test_cached_masks_sit_on_the_latent_grid_with_their_latents(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    red_left_transparent_right(data / "a.png")
    cfg = masked_config(data)
    dataset = TrainDataset(scan_dataset(cfg), cfg)

    def encode(pixels):  # 8× smaller latents, what a VAE gives: the masks are cached on their grid
        return torch.nn.functional.avg_pool2d(pixels, 8).repeat(1, 2, 1, 1)[:, :4]

    dataset.cache_latents(encode, tmp_path / "cache", progress=False)
    crop = dataset._fixed_crops[0]
    for flip in (False, True):
        expected = torch.nn.functional.avg_pool2d(dataset.mask(0, crop, flip)[None], 8)[0]
        assert torch.equal(dataset._cached_mask(0, flip), expected)
    assert torch.equal(dataset._cached_mask(0, True), dataset._cached_mask(0, False).flip(-1))
    sample = dataset[0]
    assert sample["latents"].shape[-2:] == sample["mask"].shape[-2:] == (4, 4)


def test_a_masked_run_trains(tmp_path, tiny_models):
    data = make_dataset(tmp_path / "data", n=2, size=32)
    red_left_transparent_right(data / "img009.png", 32, 32)
    run, events, _ = train_run(tmp_path, tiny_models("sd1"), data, "masked", "schedule.max_steps=2",
                               "loss.masked=true", "dataset.cache_latents=true")
    losses = [e["loss"] for e in events if e["event"] == "step"]
    assert len(losses) == 2 and all(np.isfinite(losses))
    assert (run / "masked.safetensors").is_file()
