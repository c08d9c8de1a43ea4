"""Write constraints.txt: the exact versions installed in this venv of everything the project
and its test extras need (the dependency closure, walked through the installed metadata).

setup.sh installs with `-c constraints.txt`, so a fresh machine gets the versions the tests
passed with. torch is left out (setup.sh installs it first as torch==$TORCH_VERSION; its CUDA
or CPU build differs per machine), and so are the CUDA wheels a CUDA torch brings.

Refresh (newest versions pyproject.toml allows, then pin them):  ./setup.sh --refresh-constraints
"""
from __future__ import annotations

import sys
from importlib import metadata
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

PROJECT = "sd-training-studio"
EXTRAS = ("test",)
SKIP = {"torch"}
TORCH_BUILD_PREFIXES = ("nvidia-", "triton", "cuda-")   # torch's CUDA wheels: per machine, not pinned


def closure(project: str = PROJECT, extras: tuple[str, ...] = EXTRAS) -> dict[str, str]:
    """canonical name -> installed version, for every package the project (with extras) needs."""
    found: dict[str, str] = {}
    todo: list[tuple[str, tuple[str, ...]]] = [(project, extras)]
    seen: set[tuple[str, tuple[str, ...]]] = set()
    while todo:
        name, wanted = todo.pop()
        if (name, wanted) in seen:
            continue
        seen.add((name, wanted))
        dist = metadata.distribution(name)
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is not None:
                envs = [{**default_environment(), "extra": e} for e in (wanted or ("",))]
                if not any(req.marker.evaluate(env) for env in envs):
                    continue
            key = canonicalize_name(req.name)
            if canonicalize_name(name) == "torch" and key.startswith(TORCH_BUILD_PREFIXES):
                continue
            try:
                version = metadata.version(req.name)
            except metadata.PackageNotFoundError:
                raise SystemExit(f"{req.name} (needed by {name}) is not installed: run ./setup.sh first") from None
            if key not in SKIP:
                found[key] = version
            todo.append((req.name, tuple(sorted(req.extras))))
    found.pop(canonicalize_name(project), None)
    return found


def main(out: str = "constraints.txt") -> None:
    pins = closure()
    py = ".".join(map(str, sys.version_info[:2]))
    lines = ["# Exact versions the test suite passed with (written by tools/freeze_constraints.py; Python "
             f"{py}).", "# setup.sh installs with -c constraints.txt. Refresh: ./setup.sh --refresh-constraints",
             "# torch is pinned by setup.sh (TORCH_VERSION), not here.",
             *[f"{name}=={version}" for name, version in sorted(pins.items())]]
    Path(out).write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {out}: {len(pins)} pins")


if __name__ == "__main__":
    main(*sys.argv[1:])
