"""Wan 2.2 I2V with cached latents (families/wan/family_i2v.py `pixel_conditions`, data/cache.py): the
first-frame condition (VAE(first frame ++ black frames) ++ mask) is computed once from the clip's own
pixels while its latents are cached, stored in the same cache file, and served with the batch, so a cached
step uses exactly the uncached step's condition and runs no VAE."""
from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from conftest import make_dataset
from method_runs import train_run
from video_clips import make_clip_dataset


@pytest.fixture
def vae_calls(monkeypatch):
    """Every AutoencoderKLWan encode/decode call, and for each I2V predict the calls made during it."""
    from diffusers import AutoencoderKLWan

    from trainer_backend.families.wan.family_i2v import Wan22I2VFamily
    calls = {"vae": 0, "in_predict": []}
    for name in ("encode", "decode"):
        real = getattr(AutoencoderKLWan, name)

        def counted(self, *args, _real=real, **kwargs):
            calls["vae"] += 1
            return _real(self, *args, **kwargs)
        monkeypatch.setattr(AutoencoderKLWan, name, counted)
    real_predict = Wan22I2VFamily.predict

    def predict(self, *args, **kwargs):
        before = calls["vae"]
        out = real_predict(self, *args, **kwargs)
        calls["in_predict"].append(calls["vae"] - before)
        return out
    monkeypatch.setattr(Wan22I2VFamily, "predict", predict)
    return calls


def losses(events) -> list[float]:
    return [e["loss"] for e in events if e["event"] == "step"]


def test_a_cached_run_uses_the_uncached_steps_condition_and_no_vae_per_step(tmp_path, tiny_models, vae_calls):
    i2v = tiny_models("wan22_i2v")
    data = make_clip_dataset(tmp_path / "data", n=2, size=32, frames=9)
    make_dataset(data / "stills", n=1, size=32)   # an image trains as a 1-frame clip: its condition is cached too
    common = ("schedule.max_steps=4", "schedule.epochs=100", "logging.log_every=1", "dataset.video_frames=9")
    _, plain, _ = train_run(tmp_path, i2v, data, "plain", *common)
    assert len(vae_calls["in_predict"]) == 4 and all(n >= 1 for n in vae_calls["in_predict"])  # the condition's VAE
    vae_calls["in_predict"].clear()
    _, cached, _ = train_run(tmp_path, i2v, data, "cached", *common, "dataset.cache_latents=true")
    cache = tmp_path / "cache"
    _, on_disk, _ = train_run(tmp_path, i2v, data, "on-disk", *common, "dataset.cache_latents=true",
                              "dataset.cache_latents_to_disk=true", f"dataset.cache_dir={cache}")
    assert len(vae_calls["in_predict"]) == 8 and set(vae_calls["in_predict"]) == {0}   # no VAE in a cached step
    # the same steps: each sample's condition is the one the uncached step built from its pixels (a condition
    # that went through the VAE twice, the old cached path, moved these losses by up to 6e-3)
    assert losses(cached) == pytest.approx(losses(plain), rel=1e-4, abs=1e-6)
    assert losses(on_disk) == losses(cached)
    files = [load_file(f) for f in (cache / "latents").rglob("*.safetensors")]
    assert len(files) == 3 and all("condition.i2v_condition" in f and "latents" in f for f in files)


def test_the_stored_condition_is_the_one_built_from_the_clips_first_frame(tmp_path, tiny_models):
    """Read back from the cache file: VAE(first frame ++ black frames) with the first-frame mask, as
    WanImageToVideoPipeline.prepare_latents builds it, for the window's own first frame."""
    from diffusers import WanImageToVideoPipeline

    from trainer_backend.data.video_dataset import ClipLatents, window_pixels
    from trainer_backend.data.video_items import video_options
    from trainer_backend.data.buckets import bucket_spec
    from trainer_backend.data.video_scan import scan_clips
    from trainer_backend.families import load_model
    from trainer_backend.families.wan.tiny import Z_DIM
    i2v = tiny_models("wan22_i2v")
    model = load_model(str(i2v))
    family = model.family
    data = make_clip_dataset(tmp_path / "data", n=1, size=32, frames=9)
    from trainer_backend.config import load_config
    opts = video_options(load_config(None, ["dataset.video_frames=9"]).dataset, 4)
    (window,) = scan_clips(data, opts, bucket_spec(32, False)).windows

    def encode(pixels):
        latents = family.encode_latents(model, pixels, None)
        return latents, None, family.pixel_conditions(model, pixels)
    cache = ClipLatents(encode, "tiny", opts, tmp_path / "cache", conditions=family.pixel_condition_names)
    latents, _, conditions = cache.get_entry(window)
    again = ClipLatents(encode, "tiny", opts, tmp_path / "cache", conditions=family.pixel_condition_names)
    read_back = again.get_entry(window)[2]["i2v_condition"]
    assert again.encoded == 0 and torch.equal(read_back, conditions["i2v_condition"])
    pixels = window_pixels(window, window.indices(opts.fps)).unsqueeze(0)
    pipe = WanImageToVideoPipeline.from_pretrained(str(i2v), local_files_only=True)
    with torch.no_grad():
        expected = pipe.prepare_latents(pixels[:, :, 0], 1, Z_DIM, 32, 32, 9, torch.float32, torch.device("cpu"),
                                        torch.Generator().manual_seed(0))[1]
    torch.testing.assert_close(read_back.unsqueeze(0), expected, atol=1e-5, rtol=1e-4)
    # a file cached without the condition (a T2V run's, same clip and VAE) is encoded again, with it
    t2v_style = ClipLatents(lambda p: family.encode_latents(model, p, None), "plain", opts, tmp_path / "cache2")
    t2v_style.get_entry(window)
    wants = ClipLatents(encode, "plain", opts, tmp_path / "cache2", conditions=family.pixel_condition_names)
    assert "i2v_condition" in wants.get_entry(window)[2] and wants.encoded == 1
    assert torch.equal(latents, wants.get_entry(window)[0])
    # the samples' start frame of a cached run: the first trained latent frame, decoded when a sample is drawn
    import numpy as np
    batch = {"latents": latents.unsqueeze(0), "conditions": {"i2v_condition": read_back.unsqueeze(0)}}
    with torch.no_grad():
        family.predict(model, model.denoiser, torch.randn_like(batch["latents"]), torch.tensor([500.0]),
                       {"prompt_embeds": torch.zeros(1, 4, 32)}, batch, torch.float32)
        decoded = family.decode_latents(model, batch["latents"][:, :, :1])[0, :, 0]
    image = np.asarray(family.pipeline_call_options(model)["image"], dtype=np.float32) / 127.5 - 1
    assert np.abs(image - decoded.permute(1, 2, 0).numpy()).max() <= 1 / 127
