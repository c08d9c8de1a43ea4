"""Video datasets: clips generated here with PyAV (9 frames of 32x32), probed, windowed, bucketed,
decoded and their latents cached per window through a tiny random Wan 3D VAE."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from PIL import Image

from trainer_backend.data.buckets import bucket_spec
from trainer_backend.data.video import BadClip, decode_frames, frame_count_for, frames_at_fps, probe_clip, \
    source_indices, window_starts, write_clip
from trainer_backend.data.video_scan import VideoOptions, scan_clips, summary_lines


def _frames(count: int, w: int = 32, h: int = 32) -> np.ndarray:
    """Frame n is a flat colour whose red channel is 28 * n: which frame was decoded is readable."""
    out = np.zeros((count, h, w, 3), np.uint8)
    out[..., 0] = (np.arange(count) * 28 % 256)[:, None, None]
    out[..., 1] = 90
    return out


# ---- the arithmetic ---------------------------------------------------------------------------------------

@given(st.integers(0, 500), st.sampled_from([1, 4, 8]), st.integers(0, 200))
def test_frame_count_follows_the_family_rule(available, step, max_frames):
    n = frame_count_for(available, step, max_frames)
    limit = min(available, max_frames) if max_frames else available
    if limit < 1:
        assert n == 0
        return
    assert (n - 1) % step == 0 and 1 <= n <= limit
    assert n + step > limit  # the largest such count


@given(st.integers(1, 400), st.floats(1, 120), st.floats(1, 120), st.integers(0, 50), st.integers(1, 60))
def test_source_indices_stay_in_the_clip_and_never_go_back(frames, src_fps, target_fps, start, count):
    idx = source_indices(frames, src_fps, target_fps, start, count)
    assert len(idx) == count and all(0 <= i < frames for i in idx)
    assert idx == sorted(idx)
    available = frames_at_fps(frames, src_fps, target_fps)
    assert 1 <= available <= frames
    if start + count <= available:  # inside the clip: distinct frames, as many as asked
        assert len(set(idx)) == count


@given(st.integers(0, 300), st.integers(1, 81), st.sampled_from(["head", "uniform", "random"]),
       st.integers(0, 5), st.floats(0, 0.999))
def test_windows_fit_in_the_clip(available, length, mode, max_windows, rand01):
    starts = window_starts(available, length, mode, max_windows, rand01)
    if available < length:
        assert starts == []
        return
    assert starts and all(0 <= s <= available - length for s in starts)
    if mode != "uniform":
        assert len(starts) == 1
    elif max_windows:
        assert len(starts) <= max_windows


def test_uniform_windows_cover_a_long_clip_head_takes_the_start():
    assert window_starts(100, 33, "uniform") == [0, 34, 67]
    assert window_starts(100, 33, "uniform", max_windows=2) == [0, 67]
    assert window_starts(100, 33, "head") == [0]
    with pytest.raises(ValueError, match="clip mode"):
        window_starts(100, 33, "middle")


# ---- clips on disk ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("name,codec", [("a.mp4", "libx264"), ("b.webm", "libvpx-vp9"), ("c.mov", "mpeg4")])
def test_clips_probe_and_decode_the_asked_frames(tmp_path, name, codec):
    path = write_clip(tmp_path / name, _frames(9), fps=8, codec=codec)
    info = probe_clip(path)
    assert (info.frames, info.fps, info.width, info.height, info.has_audio) == (9, 8.0, 32, 32, False)
    assert info.duration == pytest.approx(9 / 8)
    got = decode_frames(path, [0, 4, 8])
    assert got.shape == (3, 32, 32, 3)
    assert np.abs(got[:, 16, 16, 0].astype(int) - [0, 112, 224]).max() <= 4  # lossy codec, right frames


def test_a_corrupt_clip_is_one_reason_line(tmp_path):
    bad = tmp_path / "broken.mp4"
    bad.write_bytes(b"not a video at all" * 20)
    with pytest.raises(BadClip) as err:
        probe_clip(bad)
    assert "\n" not in str(err.value) and "cannot read the video" in str(err.value)


def _dataset(root: Path) -> Path:
    write_clip(root / "walk.mp4", _frames(9), fps=16)
    (root / "walk.txt").write_text("a red square walks")
    write_clip(root / "long.webm", _frames(25, 64, 32), fps=16, codec="libvpx-vp9")
    seq = root / "spin.frames"
    seq.mkdir()
    for i, frame in enumerate(_frames(5)):
        Image.fromarray(frame).save(seq / f"{i:04d}.png")
    (root / "spin.txt").write_text("it spins")
    Image.fromarray(_frames(1)[0]).save(root / "still.png")
    (root / "broken.mov").write_bytes(b"\x00" * 300)
    return root


def test_scan_windows_buckets_and_summary(tmp_path, caplog):
    root = _dataset(tmp_path / "clips")
    spec = bucket_spec(32, True, 16, 64, 16)
    scan = scan_clips(root, VideoOptions(frame_step=4, fps=16, max_frames=9, clip_mode="uniform"), spec)
    by_name: dict[str, list] = {}
    for w in scan.windows:
        by_name.setdefault(w.path.name, []).append(w)
    assert sorted(by_name) == ["long.webm", "spin.frames", "still.png", "walk.mp4"]
    assert [w.frames for w in by_name["walk.mp4"]] == [9]
    assert by_name["walk.mp4"][0].caption == "a red square walks"
    assert [w.start for w in by_name["long.webm"]] == [0, 8, 16]      # 25 frames -> 3 windows of 9
    assert by_name["long.webm"][0].bucket[0] > by_name["long.webm"][0].bucket[1]  # landscape bucket
    assert [w.frames for w in by_name["spin.frames"]] == [5]          # 5 = 4k+1
    assert [w.frames for w in by_name["still.png"]] == [1]            # an image is a 1-frame clip
    s = scan.summary
    assert (s["clips"], s["videos"], s["image_sequences"], s["images"]) == (4, 2, 1, 1)
    assert s["windows"] == 6 and s["frame_rule"] == "4k+1"
    assert s["frame_buckets"]["9x32x32"] == 1 and sum(s["frame_buckets"].values()) == 6
    assert [Path(x["file"]).name for x in s["skipped"]] == ["broken.mov"]
    assert len([r for r in caplog.records if "broken.mov" in r.getMessage()]) == 1
    text = "\n".join(summary_lines(s))
    assert "4 (2 videos, 1 image sequences, 1 images)" in text and "bucket 9x32x32" in text
    # LTX-2's rule (8k+1) on the same folder: the 5-frame sequence gives 1 frame, the 9-frame clip 9
    ltx = scan_clips(root, VideoOptions(frame_step=8, fps=16, max_frames=17, clip_mode="head"), spec)
    frames = {w.path.name: w.frames for w in ltx.windows}
    assert frames == {"walk.mp4": 9, "long.webm": 17, "spin.frames": 1, "still.png": 1}


def test_target_fps_samples_every_other_frame(tmp_path):
    path = write_clip(tmp_path / "fast.mp4", _frames(17), fps=16)
    scan = scan_clips(tmp_path, VideoOptions(frame_step=4, fps=8, max_frames=81), bucket_spec(32, False))
    (window,) = scan.windows
    assert window.frames == 9
    assert window.indices(8) == [0, 2, 4, 6, 8, 10, 12, 14, 16]
    got = decode_frames(path, window.indices(8))
    assert np.abs(got[:, 0, 0, 0].astype(int) - (np.arange(0, 17, 2) * 28 % 256)).max() <= 6


def test_random_windows_move_between_epochs(tmp_path):
    write_clip(tmp_path / "long.mp4", _frames(40), fps=16)
    scan = scan_clips(tmp_path, VideoOptions(frame_step=4, fps=16, max_frames=9, clip_mode="random", seed=3),
                      bucket_spec(32, False))
    (window,) = scan.windows
    starts = {window.indices(16, epoch, 3)[0] for epoch in range(8)}
    assert len(starts) > 1 and all(0 <= s <= 31 for s in starts)
    assert window.indices(16, 2, 3) == window.indices(16, 2, 3)  # reproducible


def test_latents_cached_per_window_through_a_tiny_wan_vae(tmp_path):
    torch = pytest.importorskip("torch")
    from diffusers import AutoencoderKLWan

    from trainer_backend.data.video_dataset import ClipLatents, window_pixels
    root = tmp_path / "clips"
    write_clip(root / "walk.mp4", _frames(9), fps=16)
    opts = VideoOptions(frame_step=4, fps=16, max_frames=9)
    (window,) = scan_clips(root, opts, bucket_spec(32, False)).windows
    pixels = window_pixels(window, window.indices(16))
    assert pixels.shape == (3, 9, 32, 32) and -1 <= pixels.min() and pixels.max() <= 1
    torch.manual_seed(0)
    vae = AutoencoderKLWan(base_dim=8, z_dim=4, dim_mult=[1, 2], num_res_blocks=1, attn_scales=[],
                           temperal_downsample=[True]).eval()
    calls = []

    def encode(x):
        calls.append(tuple(x.shape))
        return vae.encode(x).latent_dist.mode()

    cache_dir = tmp_path / "cache"
    first = ClipLatents(encode, "tiny-wan-vae", opts, cache_dir)
    latents = first.get(window)
    assert latents.shape == (4, 5, 16, 16)  # 9 frames -> 1 + 8/2 latent frames, 32 px -> 16
    assert calls == [(1, 3, 9, 32, 32)]
    again = ClipLatents(encode, "tiny-wan-vae", opts, cache_dir)  # a second run: read back, not encoded
    assert torch.equal(again.get(window), latents) and again.encoded == 0 and len(calls) == 1
    other_vae = ClipLatents(encode, "another-vae", opts, cache_dir)
    other_vae.get(window)
    assert other_vae.encoded == 1  # the key names the VAE


def test_clips_cli_prints_the_summary(tmp_path):
    import subprocess
    import sys
    root = _dataset(tmp_path / "clips")
    out = subprocess.run([sys.executable, "-m", "trainer_backend", "clips", str(root), "--frame-step", "4",
                          "--max-frames", "9", "--resolution", "32", "--clip-mode", "uniform"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "clips: 4 (2 videos, 1 image sequences, 1 images)" in out.stdout
    assert "windows: 6 (uniform, 4k+1 frames at 16 fps)" in out.stdout
    assert "skipped" in out.stdout and "broken.mov" in out.stdout
    empty = subprocess.run([sys.executable, "-m", "trainer_backend", "clips", str(tmp_path / "nope")],
                           capture_output=True, text=True, timeout=120)
    assert empty.returncode == 2 and "folder:" in empty.stderr.strip().splitlines()[-1]
