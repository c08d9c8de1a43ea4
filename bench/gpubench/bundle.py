"""`prepare`: the bundle a GPU machine needs and cannot download (it has no internet).

.gpubench/bundle/ (git-ignored, carried to the device with `carry`):
    wheels/     Python wheels for the device's Python (3.12 there: docs/gpu-bench.md), pinned to the
                versions installed in this venv, so the device runs what the tests ran with (torch aside)
    examples/   diffusers' DreamBooth LoRA example scripts, byte for byte from a diffusers git snapshot
    bundle.json what is where: the diffusers ref and commit, each script's and wheel's sha256

The device image has torch, transformers, accelerate, peft, tokenizers, safetensors and
huggingface_hub but not diffusers, pydantic or tomli-w (docs/gpu-bench.md). Profiles:
`lean` carries only what is missing there; `matched` (the default) also carries this venv's
transformers, tokenizers, peft and accelerate (and the regex that transformers checks at import),
so both trainers run on the library versions the project was tested with; `--bitsandbytes` adds
bitsandbytes (43 MB: with it only `lean` fits the device's 64 MiB carry limit).
"""
from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUNDLE = ROOT / ".gpubench" / "bundle"
DEFAULT_MIRROR = Path("/work/.mirror/huggingface+diffusers/repo")
EXAMPLES = ("train_dreambooth_lora.py", "train_dreambooth_lora_sdxl.py", "train_dreambooth_lora_flux.py")
EXAMPLES_DIR = "examples/dreambooth"

# what the device image lacks (its package list: /work/.library/device/KINDS.md); pydantic 2.14
# needs typing-extensions >= 4.16, newer than some images hold
LEAN = ("diffusers", "pydantic", "pydantic-core", "annotated-types", "typing-inspection", "typing-extensions",
        "tomli-w", "prodigyopt")
MATCHED = LEAN + ("transformers", "tokenizers", "peft", "accelerate", "regex")
BITSANDBYTES = ("bitsandbytes", "torchao")  # the tier presets' nf4 / AdamW8bit / int8 and float8 storage
# The device's limit on what travels is 64 MiB (tree + carried paths); keep room for the tree.
SIZE_LIMIT = 56 * 2 ** 20
# pip matches manylinux tags exactly: name the common ones (device README)
PLATFORMS = tuple(f"manylinux_2_{n}_x86_64" for n in (17, 24, 27, 28, 31, 34, 35)) + (
    "manylinux2014_x86_64", "manylinux1_x86_64")


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _git(repo: Path, *args: str) -> bytes:
    return subprocess.run(["git", "--git-dir", str(repo), *args], check=True, capture_output=True).stdout


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text)[:3])


def choose_ref(repo: Path, version: str, wanted: str = "") -> tuple[str, str]:
    """(ref, note): `wanted` if given; else the tag v<version>; else the newest release tag older
    than it, with a note saying so (the snapshot may end before our release)."""
    if wanted:
        return wanted, ""
    tags = [t for t in _git(repo, "tag", "--list", "v*").decode().split() if re.fullmatch(r"v\d+\.\d+\.\d+", t)]
    if f"v{version}" in tags:
        return f"v{version}", ""
    older = sorted((t for t in tags if _version_tuple(t) <= _version_tuple(version)), key=_version_tuple)
    if not older:
        raise SystemExit(f"prepare: no diffusers release tag <= {version} in {repo}")
    return older[-1], (f"the diffusers snapshot has no tag v{version}; the examples come from {older[-1]}, "
                       f"the newest release it holds (installed diffusers is {version})")


def extract_examples(repo: Path, ref: str, out: Path) -> dict:
    """Write each example script unmodified; return {name: sha256}."""
    out.mkdir(parents=True, exist_ok=True)
    found = {}
    for name in EXAMPLES:
        data = _git(repo, "show", f"{ref}:{EXAMPLES_DIR}/{name}")
        (out / name).write_bytes(data)
        found[name] = hashlib.sha256(data).hexdigest()
    return found


def pinned_versions(names: tuple[str, ...]) -> dict[str, str]:
    """This venv's installed version of each package: the versions the project's tests ran with."""
    out = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            raise SystemExit(f"prepare: {name} is not installed in this venv ({sys.executable}); "
                             "install it first (see pyproject.toml)") from None
    return out


def download_wheels(pins: dict[str, str], out: Path, python_version: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob("*.whl"):  # one version of each: two would stop the device's install
        stale.unlink()
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
           "--python-version", python_version, "--implementation", "cp", "-d", str(out)]
    for platform in PLATFORMS:
        cmd += ["--platform", platform]
    subprocess.run(cmd + [f"{n}=={v}" for n, v in pins.items()], check=True)


def folder_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def prepare(args) -> int:
    repo = Path(args.diffusers_repo)
    if not (repo / "HEAD").is_file():
        raise SystemExit(f"prepare: {repo} is not a git directory of huggingface/diffusers "
                         "(fetch github:huggingface/diffusers, or pass --diffusers-repo)")
    out = Path(args.bundle)
    version = metadata.version("diffusers")
    ref, note = choose_ref(repo, version, args.diffusers_ref)
    commit = _git(repo, "rev-parse", f"{ref}^{{commit}}").decode().strip()
    scripts = extract_examples(repo, ref, out / "examples")
    names = (LEAN if args.profile == "lean" else MATCHED) + (BITSANDBYTES if args.bitsandbytes else ())
    pins = pinned_versions(names)
    if not args.skip_wheels:
        download_wheels(pins, out / "wheels", args.python_version)
    wheels = {p.name: sha256(p) for p in sorted((out / "wheels").glob("*.whl"))}
    manifest = {"created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "python_version": args.python_version,
                "profile": args.profile, "packages": pins, "wheels": wheels,
                "diffusers": {"installed": version, "ref": ref, "commit": commit, "note": note,
                              "scripts": {f"{EXAMPLES_DIR}/{n}": h for n, h in scripts.items()}}}
    (out / "bundle.json").write_text(json.dumps(manifest, indent=1) + "\n")
    size = folder_size(out)
    print(f"bundle {out}: {len(wheels)} wheels, {len(scripts)} example scripts from diffusers {ref} ({commit[:10]}), "
          f"{size / 2 ** 20:.1f} MiB")
    if note:
        print(f"note: {note}")
    if size > SIZE_LIMIT:
        print(f"error: the bundle is {size / 2 ** 20:.1f} MiB, over the {SIZE_LIMIT / 2 ** 20:.0f} MiB that leaves "
              "room for the working tree under the device's 64 MiB: use --profile lean", file=sys.stderr)
        return 1
    return 0


def add_arguments(p) -> None:
    p.add_argument("--bundle", default=str(BUNDLE), help="where the bundle goes (default .gpubench/bundle)")
    p.add_argument("--diffusers-repo", default=str(DEFAULT_MIRROR), help="git directory of a diffusers snapshot")
    p.add_argument("--diffusers-ref", default="", help="tag or commit to take the examples from "
                                                        "(default: v<installed diffusers>, else the newest older tag)")
    p.add_argument("--python-version", default="3.12", help="the device's Python (3.12 on the lent H100/H200)")
    p.add_argument("--profile", choices=("matched", "lean"), default="matched")
    p.add_argument("--bitsandbytes", action="store_true", help="also carry bitsandbytes and torchao (use with "
                                                                  "--profile lean)")
    p.add_argument("--skip-wheels", action="store_true", help="refresh the example scripts only")
