"""Clip windows -> pixel tensors and cached latents.

A window's frames are decoded (data/video.py), resized and cropped to its bucket with the same crop
function as images (data/buckets.train_crop, one crop for every frame of the clip so the motion is
kept), and given as (C, F, H, W) in [-1, 1], the layout the video VAEs take. With an encoder the
latents are cached per window under a key of the clip's file, the source frames, the bucket and the
VAE (data/video_scan.clip_latent_key): the video VAE is the slow part, so a second epoch or a second
run with the same data decodes nothing. A window that trains its audio track (ClipWindow.audio, with an
audio encoder: data/audio.AudioEncoding) keeps its audio latents in the same file (`condition.audio_latents`),
under a key that names the audio encoder too.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np
import torch
from PIL import Image

from .audio import AudioEncoding, window_audio
from .buckets import train_crop
from .cache import DiskLatents, file_fingerprint, unpack_encoded
from .video import decode_frames
from .video_scan import ClipWindow, VideoOptions, clip_latent_key, sequence_fingerprint


def window_pixels(window: ClipWindow, indices: list[int], center_crop: bool = True,
                  rand01: tuple[float, float] = (0.5, 0.5), flip: bool = False) -> torch.Tensor:
    """The window's frames as float (3, F, H, W) in [-1, 1], at its bucket's size."""
    frames = decode_frames(window.path, indices)
    _, h, w, _ = frames.shape
    crop = train_crop(w, h, window.bucket, center_crop, rand01)
    out = []
    for frame in frames:
        image = Image.fromarray(frame).resize(crop.resized, Image.Resampling.LANCZOS)
        image = image.crop((crop.left, crop.top, crop.left + window.bucket[0], crop.top + window.bucket[1]))
        if flip:
            image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        out.append(np.asarray(image))
    array = np.stack(out).astype(np.float32) / 127.5 - 1.0          # (F, H, W, 3)
    return torch.from_numpy(array).permute(3, 0, 1, 2).contiguous()  # (3, F, H, W)


def _fingerprint(path: Path) -> str:
    return sequence_fingerprint(path) if path.is_dir() else file_fingerprint(path)


class ClipLatents:
    """Window -> latents, encoded once and kept on disk (or in memory when `folder` is None).
    `encode(pixels (1, 3, F, H, W)) -> latents (1, C, F', H', W')`, or (latents, the posterior's std in their
    layout: diffusion/posterior.py); `vae_id` names the VAE in the key. `audio`: the run's audio encoder, for
    the windows that train their audio track."""

    def __init__(self, encode: Callable[[torch.Tensor], torch.Tensor], vae_id: str, opts: VideoOptions,
                 folder: Path | None = None, conditions: tuple[str, ...] = (), audio: AudioEncoding | None = None):
        self.encode, self.vae_id, self.opts, self.audio = encode, vae_id, opts, audio
        self.conditions = tuple(conditions)   # names `encode` gives beside the latents (Family.pixel_conditions)
        self.disk = DiskLatents(folder) if folder is not None else None
        self.memory: dict[str, tuple[torch.Tensor, torch.Tensor | None, dict]] = {}
        self.encoded = 0  # how many windows were encoded (not read back): the tests and the progress line use it

    def _with_audio(self, window: ClipWindow) -> bool:
        return window.audio and self.audio is not None

    def key(self, window: ClipWindow, indices: list[int]) -> str:
        vae_id = f"{self.vae_id}|audio={self.audio.identity}" if self._with_audio(window) else self.vae_id
        return clip_latent_key(_fingerprint(window.path), window, self.opts.fps, indices, vae_id)

    def get(self, window: ClipWindow, epoch: int = 0) -> torch.Tensor:
        return self.get_with_std(window, epoch)[0]

    def get_with_std(self, window: ClipWindow, epoch: int = 0) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(latents, the posterior's std or None) of the window's frames this epoch."""
        return self.get_entry(window, epoch)[:2]

    def get_entry(self, window: ClipWindow, epoch: int = 0) -> tuple[torch.Tensor, torch.Tensor | None, dict]:
        """(latents, the posterior's std or None, {name: condition}) of the window's frames this epoch."""
        indices = window.indices(self.opts.fps, epoch, self.opts.seed)
        key = self.key(window, indices)
        if key in self.memory:
            return self.memory[key]
        required = self.conditions + (("audio_latents",) if self._with_audio(window) else ())
        if self.disk is not None and self.disk.has_conditions(key, required):
            conditions = self.disk.load_conditions(key) if required else {}
            return self.disk.load(key), self.disk.load_std(key), conditions
        with torch.no_grad():
            mean, std, conditions = unpack_encoded(self.encode(window_pixels(window, indices).unsqueeze(0)))
            if self._with_audio(window):  # from the window's audio track, not its pixels (data/audio.py)
                wave = window_audio(window, self.opts.fps, indices, self.audio.rate, self.audio.channels)
                conditions = {**conditions, "audio_latents": self.audio.encode(torch.from_numpy(wave).unsqueeze(0))}
        latents = mean[0].detach().float().cpu()
        std = None if std is None else std[0].detach().float().cpu()
        conditions = {name: t[0].detach().float().cpu() for name, t in conditions.items()}
        self.encoded += 1
        if self.disk is not None:
            self.disk.save(key, latents, std=std, conditions=conditions)
        else:
            self.memory[key] = (latents, std, conditions)
        return latents, std, conditions
