"""Wan 2.2 TI2V-5B (families/wan/family_ti2v.py): detected from its folder, fed exactly what diffusers' own
pipelines feed its transformer in both modes (text-to-video: WanPipeline with expand_timesteps; image-to-video:
WanImageToVideoPipeline with expand_timesteps, the clean first latent frame at timestep 0), with no loss on a
given first frame; trains end to end in both modes, and its LoRA files (ComfyUI's layout) load in both pipelines."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from conftest import ROOT
from trainer_backend.config import load_config
from trainer_backend.diffusion.loss import diffusion_loss
from trainer_backend.families import detect_family, load_model
from trainer_backend.families.wan.i2v import start_image_draws
from trainer_backend.families.wan.tiny_ti2v import Z_DIM


@pytest.fixture(scope="module")
def ti2v(tiny_models):
    return tiny_models("wan22_ti2v")


@pytest.fixture(scope="module")
def model(ti2v):
    return load_model(str(ti2v))


def _configs_only(src: Path, dst: Path, index: dict | None = None, **transformer) -> Path:
    """A copy of a pipeline folder's JSON files (detection reads nothing else), edited."""
    for f in src.rglob("*.json"):
        (dst / f.relative_to(src)).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(f, dst / f.relative_to(src))
    if index:
        data = json.loads((dst / "model_index.json").read_text())
        (dst / "model_index.json").write_text(json.dumps({**data, **index}))
    if transformer:
        data = json.loads((dst / "transformer" / "config.json").read_text())
        (dst / "transformer" / "config.json").write_text(json.dumps({**data, **transformer}))
    return dst


def test_a_ti2v_folder_is_detected_and_a14b_folders_are_not(ti2v, tmp_path, model):
    assert detect_family(str(ti2v)).name == "wan22_ti2v"
    # the VAE config's own spatial compression (patchify x downsampling), the full-size Wan 2.2 VAE's 16
    assert model.family.name == "wan22_ti2v" and model.vae.config.z_dim == Z_DIM
    assert model.vae_scale_factor == model.vae.config.scale_factor_spatial == 8 != 2 ** len(
        model.vae.config.temperal_downsample)
    import diffusers
    config = json.loads((ROOT / "assets/model_configs/wan22_ti2v/vae/config.json").read_text())
    with torch.device("meta"):
        full_size = diffusers.AutoencoderKLWan.from_config({k: v for k, v in config.items() if k != "_note"})
    assert model.family.spatial_compression(full_size) == 16 and full_size.config.z_dim == 48
    assert model.options["boundary_ratio"] is None and model.options["other_expert"] is None
    as_i2v = _configs_only(ti2v, tmp_path / "i2v", {"_class_name": "WanImageToVideoPipeline"})
    assert detect_family(str(as_i2v)).name == "wan22_ti2v"
    # without expand_timesteps it is a T2V folder; a transformer reading more than the latents is no TI2V-5B
    assert detect_family(str(_configs_only(ti2v, tmp_path / "t2v", {"expand_timesteps": False}))).name == "wan22_t2v"
    with pytest.raises(Exception, match="model"):
        detect_family(str(_configs_only(ti2v, tmp_path / "other", in_channels=2 * Z_DIM + 4)))


def test_a_hub_id_downloads_the_ti2v_pipeline_and_loads_it(ti2v, tmp_path, monkeypatch):
    """model.path = a hub repo id (Wan-AI/Wan2.2-TI2V-5B-Diffusers's layout) through the model sources, from a
    loopback server speaking the hub's protocol: every file the family needs, detected as TI2V."""
    from hub_server import HubServer, point_client_at
    from trainer_backend.model_sources import resolve_model
    server = HubServer().start()
    try:
        server.add_folder("Wan-AI/tiny-TI2V-Diffusers", ti2v)
        point_client_at(monkeypatch, server, tmp_path / "hf")
        folder = resolve_model("Wan-AI/tiny-TI2V-Diffusers")
    finally:
        server.stop()
    assert {p.relative_to(ti2v) for p in ti2v.rglob("*") if p.is_file()} == \
        {p.relative_to(folder) for p in folder.rglob("*") if p.is_file()}
    loaded = load_model(str(folder))
    assert loaded.family.name == "wan22_ti2v" and loaded.vae.config.z_dim == Z_DIM


def test_the_planner_tells_a_ti2v_folder_from_a_t2v_one(ti2v, tiny_models):
    """Both are WanPipeline folders: the planner (model.arch = auto) takes the family nearest in size."""
    from trainer_backend.launch.model_size import arch_of
    assert arch_of("auto", str(ti2v)) == "wan22_ti2v"
    assert arch_of("auto", str(tiny_models("wan22_t2v"))) == "wan22_t2v"


def _inputs(seed: int = 1, batch: int = 2):
    g = torch.Generator().manual_seed(seed)
    clip = torch.rand(batch, 3, 9, 32, 32, generator=g) * 2 - 1
    noisy = torch.randn(batch, Z_DIM, 3, 4, 4, generator=g)
    text = {"prompt_embeds": torch.randn(batch, 6, 32, generator=g)}
    return clip, noisy, torch.tensor([950.0, 400.0][:batch]), text


def test_predict_equals_the_pipelines_own_transformer_calls_in_both_modes(ti2v, model):
    """Fixed clips, noise and timesteps: the family's forward against the pipelines' own functions (the
    image condition from WanImageToVideoPipeline.prepare_latents, normalised by the VAE's latents_mean/std; the
    per-token timesteps built as its denoising loop builds them; WanPipeline's per-token copies of t)."""
    from diffusers import WanImageToVideoPipeline
    family = model.family
    pipe = WanImageToVideoPipeline.from_pretrained(str(ti2v), local_files_only=True)
    assert pipe.config.expand_timesteps
    clip, noisy, timesteps, text = _inputs()
    embeds = text["prompt_embeds"]
    with torch.no_grad():
        # the pipeline's image latents are the clip's normalised first latent frame (the causal VAE's, mean)
        own = [pipe.prepare_latents(clip[i:i + 1, :, 0], 1, Z_DIM, 32, 32, 9, torch.float32, torch.device("cpu"),
                                    torch.Generator().manual_seed(0)) for i in range(2)]
        condition, mask = torch.cat([c for _, c, _ in own]), own[0][2]
        torch.testing.assert_close(family.encode_latents(model, clip, None)[:, :, :1], condition,
                                   atol=1e-5, rtol=1e-4)
        i2v_input = (1 - mask) * condition + mask * noisy
        expected = {}
        for mode, first in (("i2v", mask), ("t2v", torch.ones_like(mask))):
            per_token = torch.stack([(first[0][0][:, ::2, ::2] * t).flatten() for t in timesteps])
            expected[mode] = pipe.transformer(hidden_states=i2v_input if mode == "i2v" else noisy,
                                              timestep=per_token, encoder_hidden_states=embeds,
                                              return_dict=False)[0]
        assert (expected["i2v"] - expected["t2v"]).abs().max() > 1e-4

        def predict(given_first, batch_extra=None):
            given = torch.zeros(2, 3, dtype=torch.bool)
            given[:, 0] = torch.tensor(given_first)
            batch = {"pixel_values": clip, "given_frames": given, **(batch_extra or {})}
            return family.predict(model, model.denoiser, noisy, timesteps, text, batch, torch.float32)

        torch.testing.assert_close(predict([True, True]), expected["i2v"], atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(predict([False, False]), expected["t2v"], atol=1e-5, rtol=1e-4)
        # text-to-video only (no given_frames: one timestep per sample) computes the same
        plain = family.predict(model, model.denoiser, noisy, timesteps, text, {"pixel_values": clip}, torch.float32)
        torch.testing.assert_close(plain, expected["t2v"], atol=1e-5, rtol=1e-4)
        mixed = predict([True, False])  # each sample in its own mode
        torch.testing.assert_close(mixed[0], expected["i2v"][0], atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(mixed[1], expected["t2v"][1], atol=1e-5, rtol=1e-4)
        # cached latents (no pixels): the first frame comes from the cached posterior mean, the same latents
        given = torch.tensor([[True, False, False]] * 2)
        from_cache = family.predict(model, model.denoiser, noisy, timesteps, text,
                                    {"latents": family.encode_latents(model, clip, None), "given_frames": given},
                                    torch.float32)
        torch.testing.assert_close(from_cache, expected["i2v"], atol=1e-5, rtol=1e-4)


class _FirstFrameOffset(torch.nn.Module):
    """The denoiser, with its output on the first latent frame moved far away; records its inputs."""

    def __init__(self, inner):
        super().__init__()
        self.inner, self.seen = inner, []

    def forward(self, hidden_states, timestep, **kwargs):
        self.seen.append((hidden_states.detach().clone(), timestep.detach().clone()))
        out = self.inner(hidden_states=hidden_states, timestep=timestep, **kwargs)[0].clone()
        out[:, :, 0] += 100.0
        return (out,)


def _loss(model, denoiser, probability: float, clip):
    cfg = load_config(None, ["model.arch=wan22_ti2v", f"dataset.video_start_image_probability={probability}"])
    batch = {"index": [0, 1], "pixel_values": clip, "caption": ["a red square", "a blue square"]}
    with torch.no_grad():
        return diffusion_loss(model, denoiser, batch, cfg=cfg, epoch=0, device=torch.device("cpu"),
                              weight_dtype=torch.float32).item()


def test_a_given_first_frame_is_clean_at_timestep_zero_and_carries_no_loss(model):
    clip = _inputs()[0]
    wrapped = _FirstFrameOffset(model.denoiser)
    # image-to-video for every clip: what the denoiser says about the given frame does not count
    assert _loss(model, model.denoiser, 1.0, clip) == pytest.approx(_loss(model, wrapped, 1.0, clip), rel=1e-6)
    hidden, per_token = wrapped.seen[-1]
    start = model.family.encode_latents(model, clip[:, :, :1], None)
    torch.testing.assert_close(hidden[:, :, :1], start, atol=1e-5, rtol=1e-4)  # the clip's own first frame
    assert per_token.shape == (2, 3 * 2 * 2) and (per_token[:, :4] == 0).all() and (per_token[:, 4:] > 0).all()
    # text-to-video: every frame is noised and trained
    plain = _loss(model, model.denoiser, 0.0, clip)
    assert _loss(model, wrapped, 0.0, clip) > plain + 100
    hidden, timesteps = wrapped.seen[-1]
    assert timesteps.shape == (2,) and not torch.allclose(hidden[:, :, :1], start, atol=1e-3)


def test_the_real_models_16x_geometry_trains_both_modes(tmp_path):
    """A tiny TI2V pipeline whose VAE compresses 16x as the real Wan 2.2 VAE (patchify + three downsamplings):
    64 px clips of 9 frames are 3x4x4 latents, one training step runs in each mode and the given frame's
    loss is left out."""
    from trainer_backend.families.wan.tiny_ti2v import build_tiny_wan_ti2v
    model = load_model(str(build_tiny_wan_ti2v(tmp_path / "m16", spatial=16)))
    assert model.family.name == "wan22_ti2v" and model.vae_scale_factor == 16
    clip = torch.rand(2, 3, 9, 64, 64, generator=torch.Generator().manual_seed(4)) * 2 - 1
    assert tuple(model.family.encode_latents(model, clip, None).shape) == (2, Z_DIM, 3, 4, 4)
    assert model.family.latent_shape(model, 64, 64, frames=9) == (Z_DIM, 3, 4, 4)
    wrapped = _FirstFrameOffset(model.denoiser)
    assert _loss(model, model.denoiser, 1.0, clip) == pytest.approx(_loss(model, wrapped, 1.0, clip), rel=1e-6)
    assert _loss(model, wrapped, 0.0, clip) > _loss(model, model.denoiser, 0.0, clip) + 100


def test_the_start_image_choice_is_per_clip_and_the_same_in_any_batch():
    draws = start_image_draws(3, 1, range(400))
    assert ((draws >= 0) & (draws < 1)).all()
    assert 0.4 < (draws < 0.5).float().mean() < 0.6   # about half the clips at probability 0.5
    assert torch.equal(start_image_draws(3, 1, [7, 250]), draws[[7, 250]])   # any batch, any process
    assert not torch.equal(start_image_draws(3, 2, range(400)), draws)       # a new choice each epoch


def test_samples_run_text_to_video_and_image_to_video_from_a_start_image(ti2v, model):
    from diffusers import WanImageToVideoPipeline, WanPipeline
    from PIL import Image
    pipe = model.family.build_pipeline(model)
    start = Image.new("RGB", (64, 64), (200, 30, 30))

    def clip(p, **image):
        return p(prompt="a red square", num_frames=5, height=64, width=64, num_inference_steps=2, output_type="np",
                 generator=torch.Generator().manual_seed(0), **image).frames[0]

    text_only, from_image = clip(pipe), clip(pipe, image=start)
    np.testing.assert_allclose(text_only, clip(WanPipeline.from_pretrained(str(ti2v))), atol=1e-5)
    np.testing.assert_allclose(from_image, clip(WanImageToVideoPipeline.from_pretrained(str(ti2v)), image=start),
                               atol=1e-5)
    assert np.abs(text_only - from_image).max() > 1e-2


def test_trains_both_modes_and_the_comfy_lora_loads_in_both_pipelines(tmp_path, ti2v):
    """Half the clips image-to-video, cached latents, a start-image sample prompt; the LoRA (ComfyUI's layout)
    changes WanPipeline's and WanImageToVideoPipeline's clips."""
    from diffusers import WanImageToVideoPipeline, WanPipeline
    from PIL import Image
    from method_runs import train_run
    from video_clips import make_clip_dataset
    data = make_clip_dataset(tmp_path / "data", n=4, size=32, frames=9)
    start_file = tmp_path / "start.png"
    Image.new("RGB", (32, 32), (200, 30, 30)).save(start_file)
    prompts = f"a red square --f 5 --w 32 --h 32\na red square --f 5 --w 32 --h 32 --control {start_file}"
    run, events, cfg = train_run(tmp_path, ti2v, data, "ti2v", "dataset.video_start_image_probability=0.5",
                                 "dataset.resolution=32", "schedule.max_steps=3", "schedule.batch_size=2",
                                 "dataset.cache_latents=true", "optimizer.lr=1e-2", "output.lora_format=kohya",
                                 f"samples.prompts={prompts}", "samples.every_n_steps=3", "samples.steps=2")
    (sample,) = [e for e in events if e["event"] == "sample"]
    assert len([p for p in sample["paths"] if p.endswith(".mp4")]) == 2
    lora = run / "ti2v.safetensors"
    assert all(k.startswith("diffusion_model.blocks.") for k in load_file(str(lora)))  # ComfyUI's layout
    start = Image.new("RGB", (32, 32), (30, 120, 200))
    for cls, image in ((WanPipeline, {}), (WanImageToVideoPipeline, {"image": start})):
        def frames(pipe):
            return pipe(prompt="a red square", num_frames=5, height=32, width=32, num_inference_steps=2,
                        output_type="np", generator=torch.Generator().manual_seed(0), **image).frames[0]
        pipe = cls.from_pretrained(str(ti2v))
        before = frames(pipe)
        pipe.load_lora_weights(str(lora))
        assert np.abs(frames(pipe) - before).max() > 1e-3, f"the LoRA did not change {cls.__name__}'s clip"


@pytest.mark.parametrize("check", ["accumulation", "resume"])
def test_image_to_video_steps_keep_accumulation_and_resume_exact(tmp_path, ti2v, check):
    """The conformance suite's two equalities with half the clips image-to-video (uncached: the given frame is
    encoded from the clip's pixels each step)."""
    from method_runs import train_run
    from video_clips import make_clip_dataset
    data = make_clip_dataset(tmp_path / "data", n=4, size=32, frames=9)
    mixed = "dataset.video_start_image_probability=0.5"
    if check == "accumulation":
        common = [mixed, "schedule.epochs=2", "optimizer.name=sgd", "optimizer.lr=0.5", "network.dropout=0"]
        a, _, _ = train_run(tmp_path, ti2v, data, "b4a1", "schedule.batch_size=4", *common)
        b, _, _ = train_run(tmp_path, ti2v, data, "b1a4", "schedule.batch_size=1", "schedule.grad_accum=4", *common)
        a, b = load_file(str(a / "b4a1.safetensors")), load_file(str(b / "b1a4.safetensors"))
        worst = max(((a[k] - b[k]).abs().max() / a[k].abs().max().clamp_min(1e-12)).item()
                    for k in a if not k.endswith(".alpha"))
        assert worst <= 1e-5, f"max relative difference {worst:.2e}"
        return
    common = [mixed, "schedule.max_steps=4", "checkpoints.every_n_steps=2", "optimizer.lr=1e-3", "schedule.seed=3"]
    straight, _, _ = train_run(tmp_path, ti2v, data, "straight", *common)
    checkpoint = straight / "checkpoints" / "step-00000002"
    shutil.copytree(checkpoint, tmp_path / "runs" / "resumed" / "checkpoints" / checkpoint.name)
    resumed, _, _ = train_run(tmp_path, ti2v, data, "resumed", *common)
    a, b = load_file(str(straight / "straight.safetensors")), load_file(str(resumed / "resumed.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_the_full_size_transformer_is_ti2v_5b():
    """The meta-device TI2V-5B (Wan-AI/Wan2.2-TI2V-5B-Diffusers transformer/config.json: 30 layers of width
    24 x 128 = 3072, ffn 14336, 48 latent channels in and out) has the published 5B parameters."""
    from trainer_backend.families.registry import get_family
    denoiser = get_family("wan22_ti2v").meta_denoiser()
    c = denoiser.config
    assert (c.num_layers, c.num_attention_heads * c.attention_head_dim, c.ffn_dim) == (30, 3072, 14336)
    assert (c.in_channels, c.out_channels, tuple(c.patch_size)) == (48, 48, (1, 2, 2))
    assert len(denoiser.blocks) == 30
    params = sum(p.numel() for p in denoiser.parameters())
    assert 4.9e9 < params < 5.1e9, params
