"""Shared fixtures: tiny models (built once per session by the project's own factory) and
generated datasets. Nothing is downloaded."""
from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
# One thread per torch process: the suite runs one pytest worker per core (pytest-xdist), and the
# tests start trainers and two-rank launches of their own; torch's spinning intra-op threads on
# oversubscribed cores made the parallel suite slower than the serial one. Set before any worker
# or trainer imports torch (workers and subprocesses inherit it).
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="session", autouse=True)
def _isolated_cache(tmp_path_factory):
    """Keep builtin models and caches of the test run out of the user's ~/.cache."""
    if "SD_STUDIO_CACHE" not in os.environ:
        os.environ["SD_STUDIO_CACHE"] = str(tmp_path_factory.mktemp("sd-studio-cache"))
    yield


@pytest.fixture
def fresh_accelerate_state():
    """accelerate's state is a per-process singleton that keeps the first run's mixed precision:
    an in-process run that uses this starts and ends without one."""
    from accelerate.state import AcceleratorState
    AcceleratorState._reset_state(reset_partial_state=True)
    yield
    AcceleratorState._reset_state(reset_partial_state=True)


def make_dataset(folder: Path, n: int = 4, size: int = 64, captions: list[str] | None = None,
                 seed: int = 0) -> Path:
    """n distinct coloured-shape images with same-named .txt captions."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    words = ["red", "green", "blue", "yellow", "purple", "orange", "white", "black"]
    for i in range(n):
        base = rng.integers(0, 255, size=3)
        arr = np.tile(base, (size, size, 1)).astype(np.uint8)
        x0, y0 = rng.integers(0, size // 2, size=2)
        arr[y0:y0 + size // 3, x0:x0 + size // 3] = rng.integers(0, 255, size=3)
        Image.fromarray(arr).save(folder / f"img{i:03d}.png")
        caption = captions[i] if captions else f"a {words[i % len(words)]} square on a plain background"
        (folder / f"img{i:03d}.txt").write_text(caption)
    return folder


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory):
    """arch (or a family's tiny variant, "flux2-dev" as builtin:tiny-flux2-dev) -> diffusers folder of a
    tiny random model."""
    from trainer_backend.families import build_tiny_model
    from trainer_backend.families.registry import BUILTIN_TINY
    root = tmp_path_factory.mktemp("tiny-models")
    cache: dict[str, Path] = {}

    def get(arch: str) -> Path:
        if arch not in cache:
            family, variant = BUILTIN_TINY.get(f"tiny-{arch}", (arch, ""))
            options = {"variant": variant} if variant else {}
            cache[arch] = Path(build_tiny_model(family, root / arch, seed=0, **options))
        return cache[arch]
    return get


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ----------------------------------------------------------------------------- tests that need both cores
# Some tests keep both cores of the 2-core CI machine busy on their own: two training ranks, which wait
# for each other at every collective, or the studio with chromium and a trainer. Side by side they slow
# each other down far more than a busy loop does (ZeRO-2 on two ranks: 52 s alone, 65-72 s beside one or
# two busy loops, 127-212 s beside the browser tests). pytest-xdist hands out whole files in queue order:
# the browser file first, then a quarter of the others (about as long as the browser tests take on the
# other worker), then the other two-rank files spread evenly among the rest. (A lock shared by the workers
# was tried: a worker waiting on it holds its file and idles, and two files with such tests took turns
# for minutes.)

def pytest_configure(config):
    config.addinivalue_line("markers", "both_cores: keeps two cores busy on its own (two ranks, or the studio "
                                       "with chromium); tests/conftest.py orders the files that have one")


def pytest_collection_modifyitems(config, items):
    by_file: dict = {}
    for item in items:
        by_file.setdefault(item.path, []).append(item)
    heavy = {path: sum(1 for i in group if i.get_closest_marker("both_cores")) for path, group in by_file.items()}
    spread = sorted((p for p, n in heavy.items() if n), key=lambda p: -heavy[p])
    if not spread:
        return
    first, rest = spread[0], spread[1:]
    others = [p for p, n in heavy.items() if not n]
    lead = len(others) // 4
    tail = others[lead:]
    gap = len(tail) / (len(rest) + 1)
    for k, path in enumerate(rest, start=1):
        tail.insert(min(round(k * gap) + k - 1, len(tail)), path)
    order = [first, *others[:lead], *tail]
    items[:] = [item for path in order for item in by_file[path]]
