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
# for each other at every collective, or the studio with chromium and a trainer. Beside each other they
# slowed down far more than beside a busy loop (ZeRO-2 on two ranks: 52 s alone, 65-72 s beside one or
# two busy loops, 127-212 s beside the browser test), so they take turns: a lock shared by the
# pytest-xdist workers of one run. Their files are spread through the queue so that the other worker
# mostly has something else to do meanwhile.

def pytest_configure(config):
    config.addinivalue_line("markers", "both_cores: keeps two cores busy (two ranks, or the studio with "
                                       "chromium); never runs beside another such test")


@pytest.fixture(autouse=True)
def _both_cores_take_turns(request, tmp_path_factory):
    if request.node.get_closest_marker("both_cores") is None:
        yield
        return
    import fcntl
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent   # popen-gwN's parent: one folder per run, shared by its workers
    with open(root / "both-cores.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def pytest_collection_modifyitems(config, items):
    """Files with both-cores tests spread evenly through the run (the one with the most first), the
    others in their usual order: the queue pytest-xdist hands out file by file."""
    by_file: dict = {}
    for item in items:
        by_file.setdefault(item.path, []).append(item)
    heavy = {path: sum(1 for i in group if i.get_closest_marker("both_cores")) for path, group in by_file.items()}
    spread = sorted((p for p, n in heavy.items() if n), key=lambda p: -heavy[p])
    others = [p for p, n in heavy.items() if not n]
    if not spread:
        return
    gap = (len(others) + len(spread)) / len(spread)
    order = list(others)
    for k, path in enumerate(spread):
        order.insert(min(round(k * gap), len(order)), path)
    items[:] = [item for path in order for item in by_file[path]]
