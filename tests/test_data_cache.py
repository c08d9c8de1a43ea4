"""Latent and text-encoder caches with the real tiny SD1 VAE / text encoder: correct values,
reuse across runs, invalidation by image, resolution, crop and VAE, and a dataset folder that
is never written to."""
from __future__ import annotations

import os
import time

import pytest
import torch

from test_data_helpers import caption, config, snapshot, write_image
from trainer_backend.config import ConfigError
from trainer_backend.data import TrainDataset, collate, latent_cache_dir, scan_dataset


@pytest.fixture(scope="module")
def sd1(tiny_models):
    return str(tiny_models("sd1"))          # conftest: built once per session by the project's factory


@pytest.fixture(scope="module")
def vae(sd1):
    from diffusers import AutoencoderKL
    return AutoencoderKL.from_pretrained(os.path.join(sd1, "vae")).eval()


class CountingEncoder:
    """The trainer's closure over its VAE, counting how many images it was asked to encode."""

    def __init__(self, vae):
        self.vae, self.images = vae, 0

    @torch.no_grad()
    def __call__(self, pixels: torch.Tensor) -> torch.Tensor:
        self.images += len(pixels)
        return self.vae.encode(pixels).latent_dist.mean * self.vae.config.scaling_factor


def make_data(folder, n=3):
    for i in range(n):
        caption(write_image(folder / f"{i}.png", 96, 64, seed=i), f"picture {i}")
    return folder


def cached(cfg, vae, cache_dir=None, vae_id="tiny"):
    ds = TrainDataset(scan_dataset(cfg), cfg)
    encoder = CountingEncoder(vae)
    ds.cache_latents(encoder, cache_dir, progress=False, vae_id=vae_id)
    return ds, encoder.images


def test_memory_cache_holds_the_latents_of_both_flips(tmp_path, vae):
    data = make_data(tmp_path / "d", n=2)
    cfg = config({"path": str(data), "flip": True, "repeats": 6, "cache_latents": True})
    plain = TrainDataset(scan_dataset(cfg), cfg)
    ds, encoded = cached(cfg, vae)
    assert encoded == 4                                   # 2 images × both orientations
    encode = CountingEncoder(vae)
    distinct = set()
    for i in range(len(ds)):
        sample, pixels = ds[i], plain[i]
        assert "pixel_values" not in sample and sample["latents"].shape == (4, 32, 32)  # tiny VAE: /2
        assert sample["crop_top_left"] == pixels["crop_top_left"]
        expected = encode(pixels["pixel_values"][None])[0]
        assert torch.allclose(sample["latents"], expected, atol=1e-5)
        distinct.add(round(sample["latents"].sum().item(), 4))
    assert len(distinct) == 4                              # both orientations of both images were served
    assert collate([ds[0], ds[1]])["latents"].shape == (2, 4, 32, 32)


def test_flip_is_disabled_with_a_warning_when_only_one_orientation_is_cached(tmp_path, vae, caplog):
    data = make_data(tmp_path / "d", n=1)
    cfg = config({"path": str(data), "flip": True, "cache_both_flips": False, "repeats": 4})
    ds, encoded = cached(cfg, vae)
    assert encoded == 1
    assert "flip is disabled while latents are cached" in caplog.text
    assert len({ds[i]["latents"].sum().item() for i in range(len(ds))}) == 1


def test_disk_cache_is_reused_and_invalidated_by_image_resolution_crop_and_vae(tmp_path, vae):
    data = make_data(tmp_path / "d")
    cache = tmp_path / "cache"
    cfg = config({"path": str(data), "cache_latents": True, "cache_latents_to_disk": True})
    first, encoded = cached(cfg, vae, cache)
    assert encoded == 3
    again, encoded = cached(cfg, vae, cache)
    assert encoded == 0
    assert all(torch.equal(first[i]["latents"], again[i]["latents"]) for i in range(3))

    time.sleep(0.01)
    write_image(data / "1.png", 96, 64, seed=42)          # the user edits one image
    edited, encoded = cached(cfg, vae, cache)
    assert encoded == 1
    assert not torch.equal(edited[1]["latents"], first[1]["latents"])

    assert cached(cfg, vae, cache, vae_id="another-vae")[1] == 3
    assert cached(config({"path": str(data), "resolution": 128}), vae, cache)[1] == 3
    random_crop = config({"path": str(data), "center_crop": False})
    assert cached(random_crop, vae, cache)[1] >= 2       # crops that differ from the centre ones
    assert cached(random_crop, vae, cache)[1] == 0


def test_random_crop_is_frozen_per_image_while_cached(tmp_path, vae):
    data = make_data(tmp_path / "d", n=1)
    cfg = config({"path": str(data), "center_crop": False, "repeats": 5})
    ds, _ = cached(cfg, vae)
    crops = set()
    for epoch in range(3):
        ds.set_epoch(epoch)
        crops |= {ds[i]["crop_top_left"] for i in range(len(ds))}
    assert len(crops) == 1


def test_dataset_folder_is_never_written_and_cache_inside_it_is_refused(tmp_path, vae):
    data = make_data(tmp_path / "d")
    before = snapshot(data)
    cfg = config({"path": str(data), "cache_latents": True, "cache_latents_to_disk": True,
                  "cache_dir": str(tmp_path / "elsewhere")}, output={"dir": str(tmp_path / "runs")})
    assert latent_cache_dir(cfg) == tmp_path / "elsewhere" / "latents"
    ds, _ = cached(cfg, vae, latent_cache_dir(cfg))
    _ = [ds[i] for i in range(len(ds))]
    assert snapshot(data) == before
    assert any((tmp_path / "elsewhere" / "latents").rglob("*.safetensors"))
    with pytest.raises(ConfigError, match=r"^dataset\.cache_dir: .* inside the dataset folder"):
        cached(cfg, vae, data / ".cache")


def test_text_encoder_outputs_are_cached_per_caption_when_static(tmp_path, sd1):
    from transformers import CLIPTextModel, CLIPTokenizer
    tokenizer = CLIPTokenizer.from_pretrained(os.path.join(sd1, "tokenizer"))
    encoder = CLIPTextModel.from_pretrained(os.path.join(sd1, "text_encoder")).eval()
    calls = []

    @torch.no_grad()
    def encode(captions: list[str]) -> dict:
        calls.extend(captions)
        ids = tokenizer(captions, padding="max_length", max_length=tokenizer.model_max_length, truncation=True,
                        return_tensors="pt").input_ids
        return {"hidden": encoder(ids).last_hidden_state}

    data = make_data(tmp_path / "d", n=2)
    cfg = config({"path": str(data), "repeats": 10, "caption_dropout": 0.3})
    ds = TrainDataset(scan_dataset(cfg), cfg)
    assert ds.cache_text(encode, key="tiny-te") is True
    assert sorted(calls) == ["", "picture 0", "picture 1"]   # each distinct caption once, plus the empty one
    batch = collate([ds[i] for i in range(len(ds))])
    assert "" in batch["caption"]
    for cap, hidden in zip(batch["caption"], batch["text"]["hidden"]):
        assert torch.allclose(hidden, encode([cap])["hidden"][0], atol=1e-6)

    shuffled = config({"path": str(data), "shuffle_tags": True})
    ds = TrainDataset(scan_dataset(shuffled), shuffled)
    assert ds.cache_text(encode, key="tiny-te") is False and "text" not in ds[0]


def test_latent_cache_key_follows_the_vae_weights_not_their_path(tmp_path, sd1, vae):
    """A VAE saved over the old one in place (e.g. a VAE fine-tune written to the same folder)
    gives a new identity, so cached latents are re-encoded; other components do not matter."""
    import shutil
    from trainer_backend.families.weights_identity import weights_identity
    model = tmp_path / "model"
    shutil.copytree(sd1, model)
    before = weights_identity(model, subfolder="vae")
    assert before == weights_identity(model, subfolder="vae")          # stable while untouched
    unet_file = next((model / "unet").glob("*.safetensors"))
    unet_file.write_bytes(unet_file.read_bytes() + b" ")                 # another component changes
    assert weights_identity(model, subfolder="vae") == before
    time.sleep(0.01)
    with torch.no_grad():
        vae.decoder.conv_out.bias.add_(0.5)
    try:
        vae.save_pretrained(model / "vae")                               # overwritten in place
    finally:
        with torch.no_grad():
            vae.decoder.conv_out.bias.sub_(0.5)
    after = weights_identity(model, subfolder="vae")
    assert after != before
    single = tmp_path / "vae.safetensors"
    shutil.copy(next((model / "vae").glob("*.safetensors")), single)
    assert weights_identity(single) != weights_identity(model, subfolder="vae")
    assert weights_identity("") == "" and weights_identity("builtin:tiny-sd1") == "builtin:tiny-sd1"

    data = make_data(tmp_path / "d")
    cache = tmp_path / "cache"
    cfg = config({"path": str(data), "cache_latents": True, "cache_latents_to_disk": True})
    assert cached(cfg, vae, cache, vae_id=before)[1] == 3
    assert cached(cfg, vae, cache, vae_id=before)[1] == 0
    assert cached(cfg, vae, cache, vae_id=after)[1] == 3


@pytest.mark.parametrize("offload", [False, True])
def test_caches_are_built_before_the_denoiser_is_placed(tmp_path, sd1, monkeypatch, offload):
    """A real training run with both caches: the tiny SD1 UNet is moved to the device only after the
    text and latent caches are complete (docs/memory.md, "The cache pass"), so the cache pass never
    shares the GPU with the denoiser; with memory.offload_encoders the encoders' parts came in for the
    cache pass and were home again by then."""
    from conftest import make_dataset
    from method_runs import train_run
    from trainer_backend.training import block_swap, loop
    order, seen = [], {}
    real_load, real_to = loop.load_base_model, torch.nn.Module.to

    def load(cfg, accelerator, *args, **kwargs):  # (the hub's download events ride along)
        seen["model"] = model = real_load(cfg, accelerator, *args, **kwargs)
        return model

    def to(self, *args, **kwargs):
        model = seen.get("model")
        if model is not None and self is model.denoiser and "denoiser placed" not in order:
            order.append("denoiser placed")
            swaps = seen.get("swaps", [])
            seen["encoders home"] = all(not s.resident for s in swaps) and all(s.moves for s in swaps)
        return real_to(self, *args, **kwargs)

    def after(name, real):
        def run(self, *args, **kwargs):
            out = real(self, *args, **kwargs)
            order.append(name)
            return out
        return run

    real_offload = block_swap.offload_frozen

    def offload_frozen(modules, device):
        seen["swaps"] = swaps = real_offload(modules, device)
        return swaps

    monkeypatch.setattr(loop, "load_base_model", load)
    monkeypatch.setattr(torch.nn.Module, "to", to)
    monkeypatch.setattr(TrainDataset, "cache_text", after("text cached", TrainDataset.cache_text))
    monkeypatch.setattr(TrainDataset, "cache_latents", after("latents cached", TrainDataset.cache_latents))
    from trainer_backend.training import memory_setup
    monkeypatch.setattr(memory_setup, "offload_frozen", offload_frozen)
    data = make_dataset(tmp_path / "data", n=2, size=32)
    train_run(tmp_path, sd1, data, "order", "schedule.max_steps=1", "dataset.cache_latents=true",
              "dataset.cache_text_encoder_outputs=true", f"memory.offload_encoders={str(offload).lower()}")
    assert order == ["text cached", "latents cached", "denoiser placed"], order
    if offload:
        assert len(seen["swaps"]) >= 2 and seen["encoders home"]  # the VAE and the text encoder
