"""Wan 2.2 I2V training (families/wan/family_i2v.py) feeds the transformer exactly what
WanImageToVideoPipeline feeds it for the clip's first frame, and samples from that first frame."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from trainer_backend.families import load_model
from trainer_backend.families.wan.family_i2v import SAMPLE_IMAGE
from trainer_backend.families.wan.tiny import Z_DIM


@pytest.fixture(scope="module")
def i2v(tiny_models):
    return tiny_models("wan22_i2v")


def test_predict_equals_the_pipelines_own_transformer_call(i2v):
    from diffusers import WanImageToVideoPipeline
    model = load_model(str(i2v))
    assert model.family.name == "wan22_i2v" and model.options["boundary_ratio"] == 0.9
    pipe = WanImageToVideoPipeline.from_pretrained(str(i2v), local_files_only=True)
    g = torch.Generator().manual_seed(1)
    clip = torch.rand(2, 3, 9, 32, 32, generator=g) * 2 - 1
    noisy = torch.randn(2, Z_DIM, 3, 4, 4, generator=g)
    timesteps = torch.tensor([950.0, 400.0])
    text = {"prompt_embeds": torch.randn(2, 6, 32, generator=g)}
    with torch.no_grad():
        got = model.family.predict(model, model.denoiser, noisy, timesteps, text, {"pixel_values": clip},
                                   torch.float32)
        # the pipeline's own condition for each first frame, and its own transformer call on it
        conditions = [pipe.prepare_latents(clip[i:i + 1, :, 0], 1, Z_DIM, 32, 32, 9, torch.float32,
                                           torch.device("cpu"), torch.Generator().manual_seed(0))[1]
                      for i in range(2)]
        expected = pipe.transformer(hidden_states=torch.cat([noisy, torch.cat(conditions)], dim=1),
                                    timestep=timesteps, encoder_hidden_states=text["prompt_embeds"],
                                    return_dict=False)[0]
    assert got.shape == noisy.shape
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)
    # a different first frame is a different prediction: the condition reaches the transformer
    other = clip.clone()
    other[:, :, 0] = -other[:, :, 0]
    with torch.no_grad():
        changed = model.family.predict(model, model.denoiser, noisy, timesteps, text, {"pixel_values": other},
                                       torch.float32)
    assert (changed - got).abs().max() > 1e-4


def test_samples_start_from_the_first_trained_frame(i2v):
    model = load_model(str(i2v))
    family = model.family
    grey = family.pipeline_call_options(model)["image"]  # before any step: a plain frame
    assert np.asarray(grey).std() == 0
    clip = torch.rand(1, 3, 9, 32, 32, generator=torch.Generator().manual_seed(2)) * 2 - 1
    with torch.no_grad():  # latents without pixels or a cached condition: the first frame comes back through the VAE
        latents = family.encode_latents(model, clip, None)
        family.predict(model, model.denoiser, torch.randn_like(latents), torch.tensor([500.0]),
                       {"prompt_embeds": torch.zeros(1, 4, 32)}, {"latents": latents}, torch.float32)
        decoded = family.decode_latents(model, latents[:, :, :1])[0, :, 0]
    image = family.pipeline_call_options(model)["image"]
    assert np.abs(np.asarray(image, dtype=np.float32) / 127.5 - 1 - decoded.permute(1, 2, 0).numpy()).max() <= 1 / 127
    pipe = family.build_pipeline(model)
    out = pipe(prompt="a red square", num_inference_steps=2, height=32, width=32, num_frames=5,
               generator=torch.Generator().manual_seed(0), output_type="np", **family.pipeline_call_options(model))
    assert out.frames[0].shape == (5, 32, 32, 3)


def test_an_offloaded_wan_vae_still_compresses_time():
    """memory.offload_encoders moves each call's inputs to the device: AutoencoderKLWan's causal cache is a
    list its blocks fill in place, so it must stay the caller's list (else no temporal downsampling)."""
    from trainer_backend.families.wan.tiny import tiny_components
    from trainer_backend.training.block_swap import offload_frozen
    vae = tiny_components(seed=0, experts=1)["vae"]
    clip = torch.rand(1, 3, 9, 32, 32, generator=torch.Generator().manual_seed(3)) * 2 - 1
    with torch.no_grad():
        plain = vae.encode(clip).latent_dist.mode()
        swaps = offload_frozen([vae], torch.device("cpu"))
        offloaded = vae.encode(clip).latent_dist.mode()
    assert swaps and plain.shape[2] == 3
    assert torch.equal(offloaded, plain)


def test_both_experts_train_from_cached_clips_with_first_frame_samples(tmp_path, i2v):
    """model.expert = both on cached clip latents (and their cached first-frame conditions): one LoRA per
    expert, each loading into WanImageToVideoPipeline and changing its clip; the run's samples are clips."""
    from diffusers import WanImageToVideoPipeline
    from PIL import Image
    from method_runs import train_run
    from video_clips import make_clip_dataset
    data = make_clip_dataset(tmp_path / "data", n=4, size=32, frames=9)
    start_file = tmp_path / "start.png"
    Image.new("RGB", (32, 32), (200, 30, 30)).save(start_file)
    # the first prompt samples from the trained first frame, the second from its own start image (--control)
    prompts = f"a red square --f 5\na red square --f 5 --control {start_file}"
    run, events, _ = train_run(tmp_path, i2v, data, "both", "model.expert=both", "schedule.max_steps=3",
                               "schedule.batch_size=2", "dataset.cache_latents=true", "optimizer.lr=1e-2",
                               f"samples.prompts={prompts}", "samples.every_n_steps=3", "samples.steps=2",
                               "samples.width=32", "samples.height=32")
    (sample,) = [e for e in events if e["event"] == "sample"]
    clips = sorted(p for p in sample["paths"] if p.endswith(".mp4"))
    assert len(clips) == 2
    from trainer_backend.data.video import decode_frames
    a, b = (decode_frames(Path(c), list(range(5))).astype(np.float32) for c in clips)
    assert np.abs(a - b).max() > 1  # same prompt and seed: only the start image differs
    high, low = run / "both.safetensors", run / "both_low_noise.safetensors"
    start = Image.new("RGB", (32, 32), (30, 120, 200))

    def frames(pipe):
        return pipe(prompt="a red square", image=start, num_frames=5, height=32, width=32, num_inference_steps=4,
                    output_type="np", generator=torch.Generator().manual_seed(0)).frames[0]

    before = frames(WanImageToVideoPipeline.from_pretrained(i2v))
    for file, into_2 in ((high, False), (low, True)):
        pipe = WanImageToVideoPipeline.from_pretrained(i2v)
        pipe.load_lora_weights(str(file), load_into_transformer_2=into_2)
        assert np.abs(frames(pipe) - before).max() > 1e-3, f"{file.name} did not change the clip"


def test_a_sample_prompt_may_name_one_start_image_for_i2v_only():
    from trainer_backend.config import load_config, rules

    def found(arch, prompt):
        return [str(p) for p in rules.problems(load_config(None, [f"model.arch={arch}", f"samples.prompts={prompt}"]))
                if p.key == "samples.prompts"]
    assert found("wan22_i2v", "a cat --control start.png") == []
    assert found("wan22_t2v", "a cat --control start.png") == [
        "samples.prompts: line 1: --control: wan22_t2v (model.arch) takes no control image"]
    assert found("wan22_i2v", "a cat --control a.png --control b.png") == [
        "samples.prompts: line 1: 2 --control images: wan22_i2v (model.arch) takes one"]
