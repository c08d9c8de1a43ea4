"""What cached things (latents, generated class images) depend on: the weight files themselves.

A path alone is not enough: users overwrite a VAE or checkpoint in place (a new VAE fine-tune
saved to the same folder), and a cache keyed by the path would keep serving stale results.
Size and modification time of every weight file are cheap to read and change on every rewrite.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".ckpt", ".pt", ".pth", ".json")


def weights_identity(path: str | Path, subfolder: str = "") -> str:
    """A short hash of the weight files at path (a file, or a folder searched recursively;
    `subfolder` narrows a diffusers folder to one component when it exists). Paths that do not
    exist (e.g. "builtin:…" before it is built, "" for no override) hash to the text itself."""
    text = str(path)
    if not text:
        return ""
    root = Path(text).expanduser()
    if subfolder and (root / subfolder).is_dir():
        root = root / subfolder
    if root.is_file():
        files = [root]
    elif root.is_dir():
        files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix.lower() in WEIGHT_SUFFIXES)
    else:
        return text
    h = hashlib.blake2b(digest_size=12)
    h.update(str(root.resolve()).encode())
    for f in files:
        st = f.stat()
        h.update(f"\0{f.relative_to(root) if f != root else f.name}|{st.st_size}|{st.st_mtime_ns}".encode())
    return h.hexdigest()
