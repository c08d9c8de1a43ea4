"""Video through the one loop (docs/video.md): a video family's dataset holds clip windows beside images
(1-frame clips), batches are 5D, clip latents are cached per window, samples are mp4 clips with a frame
strip, and Wan 2.2's experts each train over their own timestep range."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st
from PIL import Image
from safetensors import safe_open

from conftest import make_dataset
from method_runs import train_run
from video_clips import make_clip_dataset, moving_square
from trainer_backend.config import load_config
from trainer_backend.data import TrainDataset, scan_dataset
from trainer_backend.data.video import probe_clip, write_clip
from trainer_backend.data.video_items import video_options


def _mixed_folder(root):
    """Two 9-frame clips, a 17-frame clip, a 3-frame clip, a broken clip and one image."""
    make_clip_dataset(root, n=2, size=32, frames=9)
    write_clip(root / "long.mp4", moving_square(17, 32, seed=5), fps=16)
    (root / "long.txt").write_text("a long clip")
    write_clip(root / "short.mp4", moving_square(3, 32, seed=6), fps=16)
    (root / "broken.mov").write_bytes(b"\x00" * 300)
    make_dataset(root / "still", n=1, size=32)
    return root


def _cfg(root, *overrides):
    return load_config(None, [f"dataset.path={root}", "dataset.resolution=32", *overrides])


def test_clips_are_windows_beside_images_and_batches_never_mix_them(tmp_path, caplog):
    root = _mixed_folder(tmp_path / "data")
    cfg = _cfg(root, "dataset.video_frames=9")
    scan = scan_dataset(cfg, video=video_options(cfg.dataset, 4))
    clips = {item.path.name: item.clip.frames for item in scan.items if item.clip is not None}
    assert clips == {"clip000.mp4": 9, "clip001.mp4": 9, "long.mp4": 9, "short.mp4": 1}  # 4k+1, at most 9
    assert [item.path.name for item in scan.items if item.clip is None] == ["img000.png"]
    assert [s["file"] for s in scan.summary["skipped"]] == [str(root / "broken.mov")]  # one line, named
    assert scan.summary["video"]["frame_buckets"] == {"1x32x32": 1, "9x32x32": 3}
    assert sorted(scan.buckets) == [(32, 32), (32, 32, 1), (32, 32, 9)]  # the image is not batched with clips
    dataset = TrainDataset(scan, cfg)
    shapes = {dataset.items[dataset.sample_items[i]].path.name: tuple(dataset[i]["pixel_values"].shape)
              for i in range(len(dataset))}
    assert shapes["clip000.mp4"] == (3, 9, 32, 32) and shapes["img000.png"] == (3, 32, 32)
    # a clip deleted after the scan: its samples train on another clip of the same frame bucket, one warning
    (root / "clip001.mp4").unlink()
    broken = next(i for i in range(len(dataset)) if dataset.items[dataset.sample_items[i]].path.name == "clip001.mp4")
    assert tuple(dataset[broken]["pixel_values"].shape) == (3, 9, 32, 32)
    assert any("clip001.mp4: skipped during training" in r.message for r in caplog.records)
    # an image family's scan of the same folder: the image only
    assert [item.path.name for item in scan_dataset(cfg).items] == ["img000.png"]


def test_frame_buckets_pick_the_largest_count_a_clip_allows(tmp_path):
    root = _mixed_folder(tmp_path / "data")
    cfg = _cfg(root, "dataset.video_frame_buckets=[5, 17]", "dataset.video_clip_mode=uniform")
    scan = scan_dataset(cfg, video=video_options(cfg.dataset, 4))
    frames = sorted((item.path.name, item.clip.frames, item.clip.start) for item in scan.items if item.clip)
    assert frames == [("clip000.mp4", 5, 0), ("clip000.mp4", 5, 4), ("clip001.mp4", 5, 0), ("clip001.mp4", 5, 4),
                      ("long.mp4", 17, 0)]
    assert any(s["file"].endswith("short.mp4") and "fewer than 5" in s["reason"] for s in scan.summary["skipped"])


def test_clip_latents_are_cached_per_window_and_a_second_run_encodes_none(tmp_path, tiny_models):
    from trainer_backend.families import load_model
    model = load_model(str(tiny_models("wan22_t2v")))
    root = make_clip_dataset(tmp_path / "data", n=2, size=32, frames=9)
    make_dataset(root / "still", n=1, size=32)  # an image: a 1-frame clip's latents
    cfg = _cfg(root, "dataset.cache_latents=true")
    scan = scan_dataset(cfg, video=video_options(cfg.dataset, model.family.frame_step))

    def encode(pixels):
        return model.family.encode_latents(model, pixels, None)

    first = TrainDataset(scan, cfg)
    first.cache_latents(encode, tmp_path / "cache", progress=False, vae_id="tiny")
    shapes = {first.items[first.sample_items[i]].path.name: tuple(first[i]["latents"].shape)
              for i in range(len(first))}
    assert shapes == {"clip000.mp4": (4, 3, 4, 4), "clip001.mp4": (4, 3, 4, 4), "img000.png": (4, 1, 4, 4)}
    assert first.encoded_count == 3  # 9 frames -> 3 latent frames; the image: 1
    clip = next(i for i in range(len(first)) if first.items[first.sample_items[i]].path.name == "clip000.mp4")
    latents = first[clip]["latents"]
    again = TrainDataset(scan, cfg)
    again.cache_latents(encode, tmp_path / "cache", progress=False, vae_id="tiny")
    assert again.encoded_count == 0 and torch.equal(again[clip]["latents"], latents)
    with torch.no_grad():  # what the cache holds is the clip's own encoding
        direct = encode(TrainDataset(scan, _cfg(root))[clip]["pixel_values"].unsqueeze(0))[0]
    assert torch.allclose(direct, latents, atol=1e-5)


def test_low_noise_expert_trains_on_clips_samples_mp4_and_loads_into_transformer_2(tmp_path, tiny_models):
    from diffusers import WanPipeline
    model_dir = tiny_models("wan22_t2v")
    data = make_clip_dataset(tmp_path / "data", n=2, size=32, frames=9)
    run, events, _ = train_run(tmp_path, model_dir, data, "low", "model.expert=low", "output.lora_format=kohya",
                               "schedule.max_steps=3", "optimizer.lr=1e-2", "dataset.cache_latents=true",
                               "dataset.cache_text_encoder_outputs=true", "samples.prompts=a red square --f 5",
                               "samples.every_n_steps=3")
    (sample,) = [e for e in events if e["event"] == "sample"]
    clip, strip = sample["paths"]
    assert clip.endswith("_p00.mp4") and strip.endswith("_p00.strip.png")
    info = probe_clip(run / "samples" / clip.rsplit("/", 1)[-1])
    assert (info.frames, info.width, info.height) == (5, 32, 32)
    assert Image.open(strip).size[1] == 96
    from gui.sample_grid import grid_of  # the Run page's grid: the prompt's cell plays the clip
    grid = grid_of(run, [sample])
    assert grid.prompts == ["a red square"] and grid.cells == {(0, 0): clip}
    lora = run / "low.safetensors"

    def frames(pipe):
        return pipe(prompt="a red square", num_frames=5, height=32, width=32, num_inference_steps=4,
                    output_type="np", generator=torch.Generator().manual_seed(0)).frames[0]

    pipe = WanPipeline.from_pretrained(model_dir)
    before = frames(pipe)
    pipe.load_lora_weights(str(lora), load_into_transformer_2=True)
    assert np.abs(frames(pipe) - before).max() > 1e-3, "the low-noise LoRA did not change the clip"
    assert any("lora" in n for n, _ in pipe.transformer_2.named_parameters())
    assert not any("lora" in n for n, _ in pipe.transformer.named_parameters())  # the high expert untouched
    with safe_open(str(lora), "pt") as f:
        assert f.metadata()["ss_network_module"] == "networks.lora_wan"  # musubi-tuner's Wan LoRA module
        assert all(k.startswith("diffusion_model.blocks.") for k in f.keys())  # ComfyUI's layout


@settings(max_examples=25, deadline=None)
@given(expert=st.sampled_from(["high", "low", "both"]), seed=st.integers(0, 10_000),
       sampling=st.sampled_from(["uniform", "logit_normal", "sigmoid"]), shift=st.sampled_from([0.0, 1.0, 5.0]))
def test_each_expert_draws_timesteps_only_from_its_range(expert, seed, sampling, shift):
    from trainer_backend.families.wan.family import WAN22_T2V
    model = SimpleNamespace(options={"expert": expert, "boundary_ratio": 0.875},
                            scheduler_config={"shift": 3.0, "num_train_timesteps": 1000})
    loss = load_config(None, [f"loss.timestep_sampling={sampling}", f"loss.flow_shift={shift}"]).loss
    _, timesteps, _ = WAN22_T2V.objective(model).draw(list(range(64)), seed, 0, (4, 3, 4, 4), loss)
    low, high = {"high": (875, 1000), "low": (0, 875), "both": (0, 1000)}[expert]
    assert ((timesteps >= low) & (timesteps < high)).all(), timesteps


def test_sample_prompts_take_a_frame_count():
    from trainer_backend.config.sample_prompts import SamplePrompt, parse_prompt_line
    from trainer_backend.diffusion.sampling import frame_count
    assert parse_prompt_line("a cat walks --f 33 --w 64", SamplePrompt("")).frames == 33
    with pytest.raises(ValueError, match="--f must be at least 1"):
        parse_prompt_line("a cat --f 0", SamplePrompt(""))
    assert [frame_count(n, 4) for n in (1, 5, 20, 33)] == [1, 5, 17, 33] and frame_count(20, 8) == 17


def test_both_experts_route_each_sample_to_the_expert_of_its_timestep(tiny_models):
    from diffusers import WanPipeline
    from trainer_backend.families.wan.both_experts import WanExperts
    pipe = WanPipeline.from_pretrained(tiny_models("wan22_t2v"))
    both = WanExperts(pipe.transformer, pipe.transformer_2, boundary=875.0)
    torch.manual_seed(0)
    x, text = torch.randn(4, 4, 3, 4, 4), torch.randn(4, 8, 32)
    t = torch.tensor([900.0, 100.0, 875.0, 874.0])
    with torch.no_grad():
        alone = pipe.transformer_2(hidden_states=x[1:2], timestep=t[1:2], encoder_hidden_states=text[1:2])[0]
    seen = {"transformer": [], "transformer_2": []}
    for name in seen:
        getattr(both, name).register_forward_pre_hook(
            lambda m, args, kwargs, name=name: seen[name].extend(kwargs["timestep"].tolist()), with_kwargs=True)
    with torch.no_grad():
        out = both(hidden_states=x, timestep=t, encoder_hidden_states=text)[0]
    assert seen == {"transformer": [900.0, 875.0], "transformer_2": [100.0, 874.0]}  # as WanPipeline splits
    assert torch.allclose(out[1:2], alone, atol=1e-6)


def test_both_experts_train_in_one_run_and_write_one_file_per_expert(tmp_path, tiny_models):
    from diffusers import WanPipeline
    model_dir = tiny_models("wan22_t2v")
    data = make_clip_dataset(tmp_path / "data", n=4, size=32, frames=9)
    run, events, _ = train_run(tmp_path, model_dir, data, "both", "model.expert=both", "schedule.max_steps=3",
                               "schedule.batch_size=2", "optimizer.lr=1e-2")
    high, low = run / "both.safetensors", run / "both_low_noise.safetensors"
    assert [e["outputs"] for e in events if e["event"] == "done"] == [[str(high), str(low)]]

    def frames(pipe):
        return pipe(prompt="a red square", num_frames=5, height=32, width=32, num_inference_steps=4,
                    output_type="np", generator=torch.Generator().manual_seed(0)).frames[0]

    base = WanPipeline.from_pretrained(model_dir)
    before = frames(base)
    for file, into_2 in ((high, False), (low, True)):
        pipe = WanPipeline.from_pretrained(model_dir)
        pipe.load_lora_weights(str(file), load_into_transformer_2=into_2)
        loaded = pipe.transformer_2 if into_2 else pipe.transformer
        assert any("lora" in n for n, _ in loaded.named_parameters()), file.name
        assert np.abs(frames(pipe) - before).max() > 1e-3, f"{file.name} did not change the clip"


def test_frame_buckets_and_both_experts_on_several_processes_are_checked_naming_the_key():
    from trainer_backend.config import rules
    found = [str(p) for p in rules.problems(load_config(None, [
        "model.arch=wan22_t2v", "dataset.video_frame_buckets=[1, 8, 17]", "model.expert=both",
        "hardware.num_processes=2"]))]
    assert "dataset.video_frame_buckets: 8: Wan 2.2 text-to-video (A14B, two experts) takes 4k+1 frames " \
           "(1, 5, 9, …)" in found
    assert any(p.startswith("hardware.ddp_find_unused_parameters: must be true") for p in found)
    assert not [p for p in rules.problems(load_config(None, [
        "model.arch=wan22_t2v", "dataset.video_frame_buckets=[1, 9, 17]", "model.expert=both"]))
        if p.key.startswith(("dataset.video", "model.expert", "hardware.ddp"))]


def test_the_plan_counts_a_video_familys_clips_without_loading_the_model(tmp_path):
    from trainer_backend.data.video_items import planned_video_options
    root = make_clip_dataset(tmp_path / "data", n=3, size=32, frames=9)
    cfg = _cfg(root, "model.path=builtin:tiny-wan22_t2v", "dataset.repeats=2")
    opts = planned_video_options(cfg)
    assert opts is not None and opts.frame_step == 4
    assert scan_dataset(cfg, video=opts).counts.samples_per_epoch == 6
    assert planned_video_options(_cfg(root, "model.path=builtin:tiny-sd1")) is None


def test_resume_of_both_experts_on_random_windows_is_bitwise_exact(tmp_path, tiny_models):
    """Both experts' adapters in the checkpoint, random windows drawn again per epoch: 4 steps straight
    equal 2 steps, a checkpoint, and 2 more in a new run."""
    import shutil
    from safetensors.torch import load_file
    data = tmp_path / "data"
    make_clip_dataset(data, n=2, size=32, frames=17)
    common = ["model.expert=both", "dataset.video_frames=9", "dataset.video_clip_mode=random", "schedule.max_steps=4",
              "checkpoints.every_n_steps=2", "optimizer.lr=1e-3", "schedule.seed=3"]
    straight, _, _ = train_run(tmp_path, tiny_models("wan22_t2v"), data, "straight", *common)
    checkpoint = straight / "checkpoints" / "step-00000002"
    shutil.copytree(checkpoint, tmp_path / "runs" / "resumed" / "checkpoints" / checkpoint.name)
    resumed, events, _ = train_run(tmp_path, tiny_models("wan22_t2v"), data, "resumed", *common)
    assert [e["step"] for e in events if e["event"] == "step"] == [3, 4]
    for suffix in ("", "_low_noise"):
        a = load_file(str(straight / f"straight{suffix}.safetensors"))
        b = load_file(str(resumed / f"resumed{suffix}.safetensors"))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), suffix


def test_cache_auto_leaves_random_windows_uncached():
    from trainer_backend.config.caching import auto_caching
    choice = auto_caching(load_config(None, ["model.arch=wan22_t2v", "dataset.video_clip_mode=random"]))
    assert not choice.latents and "video_clip_mode = random" in choice.summary()
    assert auto_caching(load_config(None, ["model.arch=wan22_t2v"])).latents
