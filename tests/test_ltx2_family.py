"""The LTX-2 family computes what LTX2Pipeline computes, on fixed inputs and the tiny model: the text
conditioning (Gemma hidden states through the connectors), the latents (normalised, packed into tokens and
back), the sigma shift of its scheduler for a clip's token count, and the transformer call; a video-only
prediction does not depend on the audio stream."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from trainer_backend.families import get_family, load_model
from trainer_backend.families.ltx2 import latents as lat
from trainer_backend.families.objectives import shift_sigma
from video_clips import clip_with_audio


@pytest.fixture(scope="module")
def model(tiny_models):
    return load_model(str(tiny_models("ltx2")))


@pytest.fixture(scope="module")
def pipe(model):
    return model.family.build_pipeline(model)


def test_registered_with_the_ltx2_frame_rule(model):
    family = get_family("ltx2")
    assert model.family is family and family.frame_step == 8
    assert family.latent_shape(model, 32, 32, frames=9) == (4, 2, 4, 4)
    clip = torch.rand(1, 3, 9, 32, 32) * 2 - 1
    assert family.encode_latents(model, clip, None).shape == (1, 4, 2, 4, 4)
    assert family.encode_latents(model, clip[:, :, 0], None).shape == (1, 4, 1, 4, 4)  # an image: 1 frame


def test_text_conditioning_is_the_pipelines(model, pipe):
    family = model.family
    captions = ["a red square", "  a much longer caption about a blue circle moving left  "]
    ours = family.encode_text(model, family.tokenize(model, captions, 0))
    embeds, mask, _, _ = pipe.encode_prompt(captions, do_classifier_free_guidance=False,
                                            max_sequence_length=family.t5_length(model), device="cpu")
    video, audio, conn_mask = pipe.connectors(embeds, mask, padding_side="left")
    assert torch.equal(ours["prompt_embeds"], video) and torch.equal(ours["audio_prompt_embeds"], audio)
    assert torch.equal(ours["prompt_attention_mask"], conn_mask)


def test_latents_are_normalised_and_packed_as_the_pipeline_does(model, pipe):
    vae = model.vae
    vae.latents_mean.copy_(torch.tensor([0.1, -0.2, 0.3, 0.0]))
    vae.latents_std.copy_(torch.tensor([0.5, 2.0, 1.0, 1.5]))
    try:
        clip = torch.rand(2, 3, 9, 32, 32) * 2 - 1
        raw = vae.encode(clip).latent_dist.mean
        ours = model.family.encode_latents(model, clip, None)
        theirs = pipe._normalize_latents(raw, vae.latents_mean, vae.latents_std, vae.config.scaling_factor)
        torch.testing.assert_close(ours, theirs)
    finally:
        vae.latents_mean.zero_()
        vae.latents_std.fill_(1.0)
    for p, pt in ((1, 1), (2, 1), (2, 2)):
        x = torch.randn(2, 3, 4, 8, 6)
        packed = lat.pack(x, p, pt)
        assert torch.equal(packed, pipe._pack_latents(x, p, pt))
        grid = (4 // pt, 8 // p, 6 // p)
        assert torch.equal(lat.unpack(packed, *grid, p, pt), pipe._unpack_latents(packed, *grid, p, pt))
        assert torch.equal(lat.unpack(packed, *grid, p, pt), x)


@settings(max_examples=25, deadline=None)
@given(frames=st.integers(1, 20), h=st.integers(1, 40), w=st.integers(1, 40))
def test_sigma_shift_is_the_schedulers_for_the_token_count(model, frames, h, w):
    """Our shifted sigmas equal what the pipeline's scheduler sets for a clip of that many tokens (mu from
    calculate_shift on the packed sequence length)."""
    from diffusers import FlowMatchEulerDiscreteScheduler
    from diffusers.pipelines.ltx2.pipeline_ltx2 import calculate_shift
    config = model.scheduler_config
    tokens = lat.token_count((4, frames, h, w))
    sched = FlowMatchEulerDiscreteScheduler.from_config(config)
    sigmas = np.linspace(1.0, 0.1, 7)
    mu = calculate_shift(tokens, config["base_image_seq_len"], config["max_image_seq_len"], config["base_shift"],
                         config["max_shift"])
    sched.set_timesteps(sigmas=sigmas, mu=mu)
    ours = shift_sigma(torch.tensor(sigmas), lat.sigma_shift(tokens, config))
    torch.testing.assert_close(ours.float(), sched.sigmas[:-1].float())


def test_predict_is_the_transformer_call_with_the_audio_stream_isolated(model, pipe):
    family, transformer = model.family, model.denoiser
    text = family.encode_text(model, family.tokenize(model, ["a red square"], 0))
    noisy = torch.randn(1, 4, 2, 4, 4)
    t = torch.tensor([700.0])
    with torch.no_grad():
        ours = family.predict(model, transformer, noisy, t, text, {}, torch.float32)
        kwargs = dict(hidden_states=pipe._pack_latents(noisy), encoder_hidden_states=text["prompt_embeds"],
                      audio_encoder_hidden_states=text["audio_prompt_embeds"], timestep=t, sigma=t,
                      encoder_attention_mask=text["prompt_attention_mask"],
                      audio_encoder_attention_mask=text["prompt_attention_mask"], num_frames=2, height=4, width=4,
                      fps=24.0, isolate_modalities=True, return_dict=False)
        # any audio (length and content): the video stream does not read it
        for audio in (torch.zeros(1, 1, 4), torch.randn(1, 5, 4)):
            video, _ = transformer(audio_hidden_states=audio, audio_num_frames=audio.shape[1], **kwargs)
            torch.testing.assert_close(ours, pipe._unpack_latents(video, 2, 4, 4))
    assert not torch.equal(ours, family.predict(model, transformer, noisy, torch.tensor([100.0]), text, {},
                                                torch.float32).detach())


def test_a_comfyui_layout_lora_trains_on_clips_samples_mp4_and_loads_in_diffusers(tmp_path, tiny_models):
    """Through the loop on generated 9-frame clips (latents and text cached), samples as mp4 clips, the
    ComfyUI-layout file (no `.alpha` keys) loads with LTX2Pipeline.load_lora_weights and changes the video."""
    from diffusers import LTX2Pipeline
    from method_runs import train_run
    from safetensors import safe_open
    from video_clips import make_clip_dataset
    from trainer_backend.data.video import probe_clip
    model_dir = tiny_models("ltx2")
    data = make_clip_dataset(tmp_path / "data", n=2, size=32, frames=9)
    run, events, _ = train_run(tmp_path, model_dir, data, "comfy", "output.lora_format=kohya", "schedule.max_steps=3",
                               "optimizer.lr=1e-2", "dataset.cache_latents=true", "dataset.video_fps=24",
                               "dataset.cache_text_encoder_outputs=true", "samples.prompts=a red square --f 9",
                               "samples.every_n_steps=3")
    (sample,) = [e for e in events if e["event"] == "sample"]
    clip = sample["paths"][0]
    assert clip.endswith("_p00.mp4")
    info = probe_clip(run / "samples" / clip.rsplit("/", 1)[-1])
    assert (info.frames, info.width, info.height) == (9, 32, 32)
    lora = run / "comfy.safetensors"
    with safe_open(str(lora), "pt") as f:
        keys = list(f.keys())
    assert keys and all(k.startswith("diffusion_model.transformer_blocks.") for k in keys)
    assert not any(k.endswith(".alpha") for k in keys)

    def frames(pipe):
        return pipe(prompt="a red square", num_frames=9, height=32, width=32, num_inference_steps=2,
                    output_type="np", generator=torch.Generator().manual_seed(0)).frames[0]

    pipe = LTX2Pipeline.from_pretrained(model_dir)
    pipe.set_progress_bar_config(disable=True)
    before = frames(pipe)
    pipe.load_lora_weights(str(lora))
    assert np.abs(frames(pipe) - before).max() > 1e-3, "the LoRA did not change the video"


def test_the_run_says_what_the_clips_audio_tracks_train(tmp_path, caplog):
    """Clips with an audio track: the scan's video summary (and train.log) say the LTX-2 LoRA trains it (the
    audio itself: tests/test_ltx2_audio.py); a family without an audio stream says it has none."""
    from trainer_backend.config import load_config
    from trainer_backend.training.setup import scan_data
    data = tmp_path / "data"
    data.mkdir()
    clip_with_audio(data / "tone.mp4")
    (data / "tone.txt").write_text("a grey frame with a tone")
    for arch, said in (("ltx2", "trained on 1 of 1 clips"),
                       ("wan22_t2v", "ignored (the model has no audio stream)")):
        cfg = load_config(None, [f"model.arch={arch}", f"dataset.path={data}", "dataset.resolution=32"])
        with caplog.at_level("INFO"):
            scan = scan_data(cfg, get_family(arch))
        assert scan.summary["video"]["with_audio"] == 1
        assert scan.summary["video"]["audio"].startswith(said)
        assert said in caplog.text
