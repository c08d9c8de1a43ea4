"""LTX-2 trains with the clip's audio track: the window's audio (same seconds as its frames) decoded and
resampled, LTX-2's log-mel spectrogram, the audio VAE's latents packed and normalised as LTX2Pipeline does,
both streams through the transformer, a LoRA that changes the pipeline's audio, clips without an audio track
training video only (the run says so), the sample mp4 carrying the generated audio."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st
from video_clips import make_clip_dataset, moving_square, sine_tone

from trainer_backend.data.audio import decode_audio, window_span
from trainer_backend.data.video import BadClip, ClipInfo, probe_clip, write_clip
from trainer_backend.families import get_family, load_model
from trainer_backend.families.ltx2 import audio as aud


@pytest.fixture(scope="module")
def model(tiny_models):
    return load_model(str(tiny_models("ltx2")))


# ---- the spectrogram ----------------------------------------------------------------------------------

@settings(max_examples=40, deadline=None)
@given(hz=st.floats(0.0, 24000.0))
def test_slaney_mel_scale_is_linear_below_1khz_and_inverts(hz):
    mel = aud.hz_to_mel(torch.tensor(hz, dtype=torch.float64))
    if hz < 1000:
        assert math.isclose(float(mel), hz * 3 / 200, rel_tol=1e-9, abs_tol=1e-9)
    assert math.isclose(float(aud.mel_to_hz(mel)), hz, rel_tol=1e-9, abs_tol=1e-6)


def test_mel_filters_are_triangles_of_unit_area_on_the_slaney_scale():
    filters = aud.mel_filters(16000, 1024, 64)
    assert filters.shape == (513, 64) and (filters >= 0).all()
    bin_hz = 16000 / 1024
    areas = filters.sum(0) * bin_hz  # Slaney normalisation: each triangle's area in Hz is 1
    torch.testing.assert_close(areas[8:], torch.ones(56), rtol=0.02, atol=0.0)  # wide enough to sample well
    peaks = filters.argmax(0)
    assert (peaks[1:] >= peaks[:-1]).all()  # centres rise with the band


def test_log_mel_is_the_magnitude_stft_through_the_filters():
    """One frame computed by hand with numpy (centred, reflect-padded, periodic Hann, |rfft|) equals
    log_mel's; a tone lands in the band around its frequency; silence sits at the log floor."""
    rate, hop, n_fft = 16000, 160, 1024
    wave = torch.from_numpy(sine_tone(0.5, 1000.0, rate, channels=2))[None]
    mel = aud.log_mel(wave, rate, hop, 64)
    assert mel.shape == (1, 2, 8000 // hop + 1, 64)
    x = np.pad(wave[0, 0].double().numpy(), n_fft // 2, mode="reflect")
    k = 10
    window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(n_fft) / n_fft)
    spectrum = np.abs(np.fft.rfft(x[k * hop:k * hop + n_fft] * window))
    by_hand = np.log(np.maximum(spectrum @ aud.mel_filters(rate, n_fft, 64).double().numpy(), 1e-5))
    np.testing.assert_allclose(mel[0, 0, k].double().numpy(), by_hand, rtol=1e-4, atol=1e-4)
    centres = aud.mel_to_hz(torch.linspace(0, float(aud.hz_to_mel(8000.0)), 66))[1:-1]
    assert abs(float(centres[mel[0, 0, k].argmax()]) - 1000.0) < 80
    assert torch.equal(aud.log_mel(torch.zeros(1, 1, 4000), rate, hop, 64), torch.full((1, 1, 26, 64), math.log(1e-5)))


# ---- a window's audio ---------------------------------------------------------------------------------

@settings(max_examples=40, deadline=None)
@given(source=st.sampled_from([12.0, 24.0, 25.0, 30.0]), target=st.sampled_from([0.0, 8.0, 16.0, 24.0, 60.0]),
       start=st.integers(0, 50), count=st.integers(1, 40))
def test_window_span_covers_its_frames_at_their_sampled_rate(source, target, start, count):
    from trainer_backend.data.video import source_indices
    info = ClipInfo(200, source, 32, 32, True)
    indices = source_indices(200, source, target, start, count)
    begin, duration = window_span(info, target, indices)
    rate = target if 0 < target < source else source
    assert begin == indices[0] / source and math.isclose(duration, count / rate)


def test_window_audio_is_the_tracks_seconds_at_the_encoders_rate(tmp_path, monkeypatch):
    from trainer_backend.data import audio as audio_module
    clip = write_clip(tmp_path / "tone.mp4", moving_square(16, 32, 0), fps=16,
                      audio=(sine_tone(3.0, 440.0, 22050), 22050))
    assert probe_clip(clip).has_audio
    audio = decode_audio(clip, 0.25, 0.5, 16000, 2)  # resampled 22.05 kHz mono -> 16 kHz stereo
    assert audio.shape == (2, 8000) and audio.dtype == np.float32
    assert np.allclose(audio[0], audio[1])
    assert np.argmax(np.abs(np.fft.rfft(audio[0]))) * 16000 / 8000 == pytest.approx(440, abs=2)
    tail = decode_audio(clip, 2.75, 0.5, 16000, 1)  # past the track's end: silence
    assert tail.shape == (1, 8000) and np.abs(tail[0, -2000:]).max() == 0
    late = decode_audio(clip, 2.1, 0.5, 16000, 2)
    monkeypatch.setattr(audio_module, "SEEK_AFTER_S", 2.0)  # a late window seeks near it: the same tone, at
    seeked = decode_audio(clip, 2.1, 0.5, 16000, 2)          # most a sample apart (22.05 -> 16 kHz grids)
    assert np.abs(seeked - late).max() < 0.3 * 2 * np.pi * 440 / 16000
    silent = write_clip(tmp_path / "silent.mp4", moving_square(9, 32, 1), fps=16)
    with pytest.raises(BadClip, match="no audio track"):
        decode_audio(silent, 0.0, 0.5, 16000, 2)


# ---- the audio latents and the transformer call ---------------------------------------------------------

def test_audio_latents_are_the_vaes_packed_and_normalised_as_the_pipeline_does(model):
    """The family's audio tokens of a waveform = LTX2Pipeline's own packing and normalisation of the audio
    VAE's posterior mean of LTX-2's log-mel (nontrivial statistics); the pipeline's unpacking gives the VAE's
    latents back, so what the LoRA learns to predict is what the pipeline decodes."""
    from diffusers import LTX2Pipeline
    vae = model.options["audio_vae"]
    assert model.family.audio_format(model) == (16000, 2)
    vae.latents_mean.copy_(torch.tensor([0.1, -0.2, 0.3, 0.0]))
    vae.latents_std.copy_(torch.tensor([0.5, 2.0, 1.0, 1.5]))
    try:
        wave = torch.from_numpy(sine_tone(9 / 16, 440.0, 16000, channels=2))[None]
        ours = model.family.encode_audio(model, wave)
        mel = aud.log_mel(wave, 16000, vae.config.mel_hop_length, vae.config.mel_bins)
        raw = vae.encode(mel).latent_dist.mode()
        theirs = LTX2Pipeline._normalize_audio_latents(LTX2Pipeline._pack_audio_latents(raw), vae.latents_mean,
                                                       vae.latents_std)
        assert torch.equal(ours, theirs)
        assert ours.shape == (1, raw.shape[2], model.denoiser.config.audio_in_channels)
        back = LTX2Pipeline._unpack_audio_latents(
            LTX2Pipeline._denormalize_audio_latents(ours, vae.latents_mean, vae.latents_std), raw.shape[2], 2)
        torch.testing.assert_close(back, raw)
    finally:
        vae.latents_mean.zero_()
        vae.latents_std.fill_(1.0)


def test_both_streams_run_with_their_cross_attention_on(model):
    family, transformer = model.family, model.denoiser
    text = family.encode_text(model, family.tokenize(model, ["a red square"], 0))
    noisy, t = torch.randn(1, 4, 2, 4, 4), torch.tensor([600.0])
    audio_a, audio_b = torch.randn(1, 14, 4), torch.randn(1, 14, 4)
    with torch.no_grad():
        video_a, pred_a = family.predict_audio_video(model, transformer, noisy, audio_a, t, text, {}, torch.float32)
        video_b, pred_b = family.predict_audio_video(model, transformer, noisy, audio_b, t, text, {}, torch.float32)
        _, direct = transformer(hidden_states=noisy.flatten(2).transpose(1, 2), audio_hidden_states=audio_a,
                                encoder_hidden_states=text["prompt_embeds"],
                                audio_encoder_hidden_states=text["audio_prompt_embeds"], timestep=t, sigma=t,
                                encoder_attention_mask=text["prompt_attention_mask"],
                                audio_encoder_attention_mask=text["prompt_attention_mask"], num_frames=2, height=4,
                                width=4, fps=24.0, audio_num_frames=14, return_dict=False)
    assert pred_a.shape == audio_a.shape and torch.equal(pred_a, direct)
    assert not torch.equal(video_a, video_b)  # the video reads the audio (audio<->video attention on)


# ---- the run --------------------------------------------------------------------------------------------

def test_the_run_says_how_many_clips_train_their_audio(tmp_path):
    from trainer_backend.config import load_config
    from trainer_backend.training.setup import scan_data
    data = make_clip_dataset(tmp_path / "data", n=3, size=32, frames=9, audio=2)
    family = get_family("ltx2")
    for extra, said, buckets in (
            ([], "trained on 2 of 3 clips; 1 has no audio track (video only)", {(32, 32, 9, 1), (32, 32, 9)}),
            (["dataset.video_audio=false"], "not trained (dataset.video_audio is off)", {(32, 32, 9)})):
        cfg = load_config(None, ["model.arch=ltx2", f"dataset.path={data}", "dataset.resolution=32", *extra])
        scan = scan_data(cfg, family)
        assert scan.summary["video"]["audio"].startswith(said)
        assert {item.batch_bucket for item in scan.items} == buckets  # a batch never mixes the two kinds
    silent = make_clip_dataset(tmp_path / "silent", n=2, size=32, frames=9)
    cfg = load_config(None, ["model.arch=ltx2", f"dataset.path={silent}", "dataset.resolution=32"])
    assert scan_data(cfg, family).summary["video"]["audio"] == ("not trained (no clip has an audio track): "
                                                               "the video stream only")


def test_an_audio_lora_trains_the_audio_stream_and_changes_the_pipelines_audio(tmp_path, tiny_models):
    """Clips with and without audio, latents cached: the cached audio latents are the family's of the window's
    audio; the LoRA's audio-stream weights moved; it loads in LTX2Pipeline and changes the generated audio; the
    sample mp4 carries an audio track."""
    from diffusers import LTX2Pipeline
    from method_runs import train_run
    from safetensors.torch import load_file

    from trainer_backend.data.audio import window_audio
    from trainer_backend.data.cache import DiskLatents
    from trainer_backend.data.video_scan import ClipWindow
    model_dir = tiny_models("ltx2")
    data = make_clip_dataset(tmp_path / "data", n=3, size=32, frames=9, audio=2)
    run, events, cfg = train_run(tmp_path, model_dir, data, "av", "schedule.max_steps=3", "optimizer.lr=3e-2",
                                 "dataset.cache_latents=true", "dataset.cache_latents_to_disk=true",
                                 "dataset.video_fps=16", "loss.audio_loss_weight=2",
                                 "samples.prompts=a red square --f 9 --w 32 --h 32 --s 2",
                                 "samples.every_n_steps=3")
    said = "trained on 2 of 3 clips; 1 has no audio track (video only)"
    assert any(f"audio: {said}" in line for line in (run / "train.log").read_text().splitlines())
    (plan,) = [e for e in events if e["event"] == "plan"]
    assert plan["video"]["audio"] == said and plan["video"]["audio_trained"] == 2
    steps = [e for e in events if e["event"] == "step"]
    assert sum("loss_audio" in e for e in steps) == 2  # batches of one clip: the silent clip's step has none
    (sample,) = [e for e in events if e["event"] == "sample"]
    assert probe_clip(run / "samples" / sample["paths"][0].rsplit("/", 1)[-1]).has_audio

    # the cache holds the window's audio tokens beside its latents, as the family encodes the window's audio
    files = sorted((tmp_path / "runs" / ".cache" / "latents").rglob("*.safetensors"))
    stored = [DiskLatents(f.parent.parent).load_conditions(f.stem) for f in files]
    assert sorted(len(s) for s in stored) == [0, 1, 1]  # the silent clip: video only
    path = data / "clip000.mp4"
    window = ClipWindow(path, "", probe_clip(path), 0, 9, (32, 32), audio=True)
    model = load_model(str(model_dir))
    wave = window_audio(window, 16, window.indices(16), 16000, 2)
    expected = model.family.encode_audio(model, torch.from_numpy(wave)[None])[0]
    assert any(torch.equal(s.get("audio_latents", torch.empty(0)), expected) for s in stored)

    lora = load_file(str(run / "av.safetensors"))
    audio_keys = [k for k in lora if "audio_attn1" in k and ("lora_B" in k or "lora_up" in k)]
    assert audio_keys and all(lora[k].abs().max() > 0 for k in audio_keys), "the audio stream did not train"

    def audio(pipe):
        return pipe(prompt="a red square", num_frames=9, height=32, width=32, num_inference_steps=2,
                    output_type="np", generator=torch.Generator().manual_seed(0)).audio

    pipe = LTX2Pipeline.from_pretrained(model_dir)
    pipe.set_progress_bar_config(disable=True)
    before = audio(pipe)
    pipe.load_lora_weights(str(run / "av.safetensors"))
    assert (audio(pipe) - before).abs().max() > 1e-4, "the LoRA did not change the audio"

    # without the cache each step decodes and encodes the window's audio: the very same steps (the three
    # clips, two of them with audio, one each)
    _, uncached, _ = train_run(tmp_path, model_dir, data, "av-uncached", "schedule.max_steps=3", "optimizer.lr=3e-2",
                               "dataset.video_fps=16", "loss.audio_loss_weight=2")
    losses = [[e["loss"] for e in run_events if e["event"] == "step"] for run_events in (events, uncached)]
    assert len(losses[0]) == 3 and losses[0] == losses[1]


def test_an_audio_vae_that_does_not_fit_the_transformer_is_one_line(model):
    """A VAE whose packed audio tokens are not the transformer's audio width (the first tiny LTX-2's, which
    did not compress the mel bins) is refused before any clip is encoded, naming model.path."""
    from dataclasses import replace

    from diffusers import AutoencoderKLLTX2Audio

    from trainer_backend.errors import ConfigError
    flat = AutoencoderKLLTX2Audio(base_channels=4, output_channels=2, ch_mult=(1,), num_res_blocks=1, resolution=32,
                                  latent_channels=2, mel_bins=8)
    other = replace(model, options={**model.options, "audio_vae": flat})
    with pytest.raises(ConfigError, match=r"^model\.path: .*audio VAE gives 16 features per audio step, its "
                                          r"transformer's audio stream takes 4$"):
        model.family.audio_format(other)


def test_independent_audio_timesteps_are_drawn_per_sample_and_reach_the_audio_stream(model):
    """loss.audio_timestep: "shared" gives the audio the video's timesteps; "independent" draws its own per
    sample (batch-size independent, shifted for the audio's token count) and the transformer's audio stream
    gets them (its output changes, the video's too through the cross-attentions)."""
    from types import SimpleNamespace

    from trainer_backend.config import TrainConfig
    from trainer_backend.diffusion.loss import audio_draws
    family, objective = model.family, model.family.objective(model)
    loss = TrainConfig().loss
    video_t = torch.tensor([500.0, 500.0])
    noise, shared = audio_draws(objective, [3, 4], 0, 1, (14, 4), loss, video_t)
    assert shared is video_t and noise.shape == (2, 14, 4)
    own = SimpleNamespace(**{**loss.model_dump(), "audio_timestep": "independent"})
    noise_own, drawn = audio_draws(objective, [3, 4], 0, 1, (14, 4), own, video_t)
    assert torch.equal(noise_own, noise)  # the audio's noise does not depend on how its timestep is drawn
    _, drawn_alone = audio_draws(objective, [4], 0, 1, (14, 4), own, video_t)
    assert torch.equal(drawn_alone, drawn[1:]) and not torch.equal(drawn, video_t)
    from trainer_backend.families.ltx2 import latents as lat
    assert objective._shift((14, 4), loss) == lat.sigma_shift(14, model.scheduler_config)  # its own token count
    text = family.encode_text(model, family.tokenize(model, ["a red square"], 0))
    noisy, audio = torch.randn(1, 4, 2, 4, 4), torch.randn(1, 14, 4)
    with torch.no_grad():
        same = family.predict_audio_video(model, model.denoiser, noisy, audio, torch.tensor([600.0]), text, {},
                                          torch.float32)
        other = family.predict_audio_video(model, model.denoiser, noisy, audio, torch.tensor([600.0]), text, {},
                                           torch.float32, audio_timesteps=torch.tensor([100.0]))
    assert not torch.equal(same[1], other[1]) and not torch.equal(same[0], other[0])
