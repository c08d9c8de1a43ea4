"""Latent and text-encoder output caches.

A latent is stored under a key that hashes everything it depends on: the image file (path,
size, mtime and a hash of its first bytes), the bucket, the resize and crop, the flip, the alpha
background and the VAE; a paired control image's latent has a key of its own file, the same way. Change any of them and the key changes, so a stale latent is never
used; old files simply stop being read. Disk caches live outside the dataset folder.
"""
from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from ..config import ConfigError, TrainConfig

CACHE_FORMAT = 2          # bump when the pixel pipeline changes in a way the key does not capture (2: + std)
_HEAD_BYTES = 1 << 16
CONDITION = "condition."  # a cache file's tensors named so are conditions stored beside the latents


def unpack_encoded(encoded) -> tuple[torch.Tensor, torch.Tensor | None, dict[str, torch.Tensor]]:
    """A cache pass's `encode` result -> (latents, the posterior's std or None, conditions): it gives the
    latents, (latents, std), or (latents, std, {name: condition}) (Family.pixel_conditions), batch first."""
    if not isinstance(encoded, tuple):
        return encoded, None, {}
    mean, std, *rest = encoded
    return mean, std, (rest[0] if rest else {})


def file_fingerprint(path: Path) -> str:
    """Cheap identity of an image file's content: size, mtime and the first 64 KiB."""
    st = path.stat()
    with open(path, "rb") as f:
        head = hashlib.blake2b(f.read(_HEAD_BYTES), digest_size=16).hexdigest()
    return f"{st.st_size}:{st.st_mtime_ns}:{head}"


def latent_key(fingerprint: str, path: Path, bucket: tuple[int, int], resized: tuple[int, int],
               crop: tuple[int, int], flipped: bool, vae_id: str, background: str, mask: str = "",
               role: str = "") -> str:
    """mask: the loss mask's identity when loss.masked is on (its latents then carry the mask).
    role: "" for a training image; "control" for a paired control image (`path`, `fingerprint` its own
    file; `resized` its training image's resized size, which it is placed at: data/pairs.py)."""
    parts = [str(CACHE_FORMAT), fingerprint, str(path.resolve()), f"{bucket}", f"{resized}", f"{crop}",
             f"flip={int(flipped)}", f"vae={vae_id}", f"bg={background}"] + ([mask] if mask else []) + \
            ([f"role={role}"] if role else [])
    return hashlib.sha256("|".join(parts).encode()).hexdigest()


def latent_cache_dir(cfg: TrainConfig) -> Path | None:
    """Where the trainer should cache latents: None (memory) unless dataset.cache_latents_to_disk;
    dataset.cache_dir, else <output.dir>/.cache/latents."""
    ds = cfg.dataset
    if not (ds.cache_latents and ds.cache_latents_to_disk):
        return None
    base = Path(ds.cache_dir).expanduser() if ds.cache_dir else Path(cfg.output.dir) / ".cache"
    return base / "latents"


def check_outside(cache_dir: Path, roots: list[Path]) -> None:
    """The dataset folder is read-only to us: refuse a cache inside it."""
    real = cache_dir.expanduser().resolve()
    for root in roots:
        if real.is_relative_to(root.resolve()):
            raise ConfigError(f"dataset.cache_dir: {cache_dir} is inside the dataset folder {root}; "
                              "caches must live outside it (the dataset is never written to)")


class DiskLatents:
    """One safetensors file per key, in two-character fan-out folders; writes are atomic so
    several processes can fill the cache at once."""

    def __init__(self, folder: Path):
        self.folder = folder

    def path(self, key: str) -> Path:
        return self.folder / key[:2] / f"{key}.safetensors"

    def has(self, key: str) -> bool:
        return self.path(key).is_file()

    def load(self, key: str) -> torch.Tensor:
        return load_file(self.path(key))["latents"]

    def load_mask(self, key: str) -> torch.Tensor:
        return load_file(self.path(key))["mask"]

    def load_std(self, key: str) -> torch.Tensor | None:
        """The posterior's std in the latents' layout (diffusion/posterior.py), None if not stored."""
        return load_file(self.path(key)).get("std")

    def has_std(self, key: str) -> bool:
        return "std" in self._names(key)

    def _names(self, key: str) -> set[str]:
        from safetensors import safe_open
        with safe_open(str(self.path(key)), framework="pt") as f:
            return set(f.keys())

    def has_conditions(self, key: str, names) -> bool:
        """The file exists and holds every named condition (a file written by a family that wanted fewer,
        e.g. Wan T2V's for the same clip and VAE, is re-encoded with them)."""
        return self.has(key) and {CONDITION + n for n in names} <= self._names(key)

    def load_conditions(self, key: str) -> dict[str, torch.Tensor]:
        """The conditions stored beside the latents (Family.pixel_conditions), {} when none."""
        return {k[len(CONDITION):]: v for k, v in load_file(self.path(key)).items() if k.startswith(CONDITION)}

    def save(self, key: str, latents: torch.Tensor, mask: torch.Tensor | None = None,
             std: torch.Tensor | None = None, conditions: dict[str, torch.Tensor] | None = None) -> None:
        target = self.path(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, suffix=".tmp")
        os.close(fd)
        try:
            tensors = {"latents": latents.contiguous().cpu()}
            if mask is not None:  # loss.masked: the mask on the latent grid, cropped and flipped alike
                tensors["mask"] = mask.contiguous().cpu()
            if std is not None:  # each step draws latents + std · eps (diffusion/posterior.py)
                tensors["std"] = std.contiguous().cpu()
            for name, tensor in (conditions or {}).items():  # Family.pixel_conditions (I2V's first-frame one)
                tensors[CONDITION + name] = tensor.contiguous().cpu()
            save_file(tensors, tmp)
            with open(tmp, "rb") as f:  # on disk before it gets its name: after a power loss a cache
                os.fsync(f.fileno())     # file is whole or absent, never short
            os.replace(tmp, target)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)


def split_text_outputs(outputs, count: int) -> list:
    """encode_fn output for a batch of captions -> one entry per caption. Accepts a tensor, a
    tuple/list of tensors, or a dict of tensors, each with the batch as the first dimension."""
    if isinstance(outputs, torch.Tensor):
        return [outputs[i].detach().cpu() for i in range(count)]
    if isinstance(outputs, dict):
        return [{k: v[i].detach().cpu() for k, v in outputs.items()} for i in range(count)]
    if isinstance(outputs, (tuple, list)):
        return [tuple(v[i].detach().cpu() for v in outputs) for i in range(count)]
    raise TypeError(f"encode_fn returned {type(outputs).__name__}; expected a tensor, tuple or dict of tensors")


def pad_text_entries(store: dict) -> dict:
    """Dict-of-tensor text entries of different lengths (dim 0) padded with zeros to the longest, so they
    stack: for text whose padding is zeros under a zero mask (Qwen-Image 2.1's encode pads so)."""
    import torch.nn.functional as F
    width = max((t.shape[0] for e in store.values() for t in e.values()), default=0)
    return {key: {k: F.pad(t, (0, 0) * (t.ndim - 1) + (0, width - t.shape[0])) for k, t in e.items()}
            for key, e in store.items()}


def stack_text(entries: list):
    """Inverse of split_text_outputs for a batch (used by collate)."""
    first = entries[0]
    if isinstance(first, torch.Tensor):
        return torch.stack(entries)
    if isinstance(first, dict):
        return {k: torch.stack([e[k] for e in entries]) for k in first}
    return tuple(torch.stack([e[j] for e in entries]) for j in range(len(first)))
