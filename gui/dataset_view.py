"""Dataset inspector and the live step plan.

The dataset scan belongs to the backend; the GUI runs it as `python -m trainer_backend
inspect` in a subprocess (no torch in the GUI process) and caches the result per dataset
settings. The plan itself is computed in-process by trainer_backend.launch.plan (pure), so the
table shown is exactly what the trainer will run."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from trainer_backend.config import ConfigError, TrainConfig, save_toml, to_dict

from gui.datasets_clips import clip_thumbnails, inspector_clip_lines, untrained_clips

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".webp", ".bmp"}
INSPECT_TIMEOUT_S = 300


@dataclass
class Inspection:
    summary: dict
    counts: object          # trainer_backend.launch.plan.DataCounts


class InspectFailed(ConfigError):
    """The scan refused the dataset; `skipped` holds its 'file: skipped: reason' lines."""

    def __init__(self, message: str, skipped: list[str] = ()):
        super().__init__(message)
        self.skipped = list(skipped)


def failure_markdown(error: Exception, shown: int = 5) -> str:
    """The inspector's text when the scan refused: the error, then why files were skipped (a
    count per reason and the first few file names), never a pointer to warnings nobody sees."""
    lines = [f"⚠️ {error}"]
    skipped = getattr(error, "skipped", [])
    if skipped:
        by_reason: dict[str, int] = {}
        for line in skipped:
            reason = line.split(": skipped: ", 1)[1]
            by_reason[reason] = by_reason.get(reason, 0) + 1
        lines += ["", f"**{len(skipped)} files skipped:** "
                  + "; ".join(f"{n} × {reason}" for reason, n in by_reason.items()), ""]
        for line in skipped[:shown]:
            path, reason = line.split(": skipped: ", 1)
            lines.append(f"- `{Path(path).name}`: {reason}")
        if len(skipped) > shown:
            lines.append(f"- … and {len(skipped) - shown} more")
    return "\n".join(lines)


def empty_views() -> list:
    """Inspector updates that clear the histogram, tags and thumbnails of a previous folder."""
    return [buckets_frame({}), tags_frame({}), []]


_CACHE: dict[str, Inspection] = {}
_LOCKS: dict[str, threading.Lock] = {}
_LOCK = threading.Lock()


def _signature(cfg: TrainConfig) -> str:
    """Dataset settings plus the folders' modification times: re-scan when either changes."""
    data = to_dict(cfg)["dataset"]
    stamps = []
    folders = [data.get("path", ""), data.get("class_path", ""), data.get("control_path", ""),
               *[s.get(key, "") for s in data.get("subsets", []) for key in ("path", "control_path")]]
    for p in folders:
        try:
            stamps.append(os.stat(p).st_mtime_ns if p else 0)
        except OSError:
            stamps.append(-1)
    return hashlib.sha1(json.dumps([data, stamps], sort_keys=True, default=str).encode()).hexdigest()


def _inspect_config(cfg: TrainConfig) -> dict:
    """A config for the scan only: the scan needs [dataset]; a missing model or more processes
    than this machine has must not stop the inspector (Start checks those)."""
    from trainer_backend.families.registry import FAMILY_NAMES
    from trainer_backend.launch.model_size import planning_arch
    data = to_dict(cfg)
    data["hardware"] = to_dict(TrainConfig())["hardware"]
    arch = planning_arch(cfg)   # the family the model names survives the stand-in: a video family's clips count
    data["model"]["path"] = f"builtin:tiny-{arch}" if arch in FAMILY_NAMES else "builtin:tiny-sd1"
    data["model"]["vae"] = ""
    return data


def _counts_from_json(counts: dict):
    from trainer_backend.launch.plan import DataCounts
    buckets = counts.get("bucket_sizes")
    return DataCounts(subsets=tuple(tuple(s) for s in counts.get("subsets", ())),
                      class_images=int(counts.get("class_images", 0) or 0),
                      bucket_sizes=tuple(buckets) if buckets else None)


def inspect_dataset(cfg: TrainConfig, python: str = sys.executable, cwd: str | Path | None = None) -> Inspection:
    """Scan the dataset (cached). Raises ConfigError naming the field when the scan refuses."""
    if not cfg.dataset.path and not cfg.dataset.subsets:
        raise ConfigError("dataset.path: required (a folder of images with captions)")
    key = _signature(cfg)
    with _LOCK:
        if key in _CACHE:
            return _CACHE[key]
        lock = _LOCKS.setdefault(key, threading.Lock())
    with lock:
        if key in _CACHE:
            return _CACHE[key]
        with tempfile.TemporaryDirectory(prefix="studio-inspect-") as tmp:
            path = Path(tmp) / "inspect.toml"
            save_toml(_inspect_config(cfg), path)
            proc = subprocess.run([python, "-m", "trainer_backend", "inspect", "--config", str(path)],
                                  capture_output=True, text=True, timeout=INSPECT_TIMEOUT_S, cwd=cwd,
                                  stdin=subprocess.DEVNULL)
        if proc.returncode != 0:
            lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
            errors = [ln[len("error:"):].strip() for ln in lines if ln.startswith("error:")]
            message = errors[-1] if errors else f"dataset.path: inspect failed ({lines[-1] if lines else '?'})"
            skipped = [ln for ln in lines if ": skipped: " in ln]
            raise InspectFailed(message.replace("; see the warnings above", ""), skipped)
        payload = next((json.loads(ln) for ln in reversed(proc.stdout.splitlines()) if ln.startswith("{")), None)
        if not payload:
            raise ConfigError("dataset.path: the dataset inspector printed no result")
        result = Inspection(summary=payload.get("summary", {}), counts=_counts_from_json(payload.get("counts", {})))
        with _LOCK:
            _CACHE[key] = result
        return result


# ----------------------------------------------------------------------------- rendering

def summary_markdown(summary: dict) -> str:
    video = summary.get("video")
    if video:   # a video family's scan: its items are clip windows and images
        images = video.get("images_as_frames", 0)
        head = (f"**{video.get('clips', 0)} clips ({video.get('windows', 0)} windows)"
                + (f" and {images} images**" if images else "**"))
    else:
        head = f"**{summary.get('images', 0)} images**"
    lines = [f"{head}, {summary.get('samples_per_epoch', 0)} samples per epoch"
             + (f", {summary.get('class_images')} class images" if summary.get("class_images") else "")
             + (f" ({summary['class_images_to_generate']} generated before training)"
                if summary.get("class_images_to_generate") else "")
             + (f", {summary.get('validation_images')} held out for validation" if summary.get("validation_images")
                else ""), "",
             *([*(f"{line}  " for line in inspector_clip_lines(video)), ""] if video else []),
             f"| subset | {'windows + images' if video else 'images'} | repeats | samples/epoch | missing captions |",
             "|---|---|---|---|---|"]
    for s in summary.get("subsets", []):
        kind = " (class)" if s.get("is_class") else ""
        lines.append(f"| `{s.get('name')}`{kind} | {s.get('images', 0)} | {s.get('repeats', 1)} | "
                     f"{s.get('samples', 0)} | {s.get('missing_captions', 0)} |")
    if summary.get("missing_captions"):
        lines.append(f"\n⚠️ {summary['missing_captions']} images have no caption file.")
    if summary.get("control_images") or summary.get("missing_controls"):
        lines.append(f"\n{summary.get('control_images', 0)} images paired with a control image (shown side by side: "
                     f"image | control).")
    if summary.get("missing_controls"):
        lines.append(f"\n⚠️ {summary['missing_controls']} images have no control image and are skipped:")
        for key, files in (summary.get("missing_control_files") or {}).items():
            names = ", ".join(f"`{Path(f).name}`" for f in files[:5]) + (", …" if len(files) > 5 else "")
            lines.append(f"- {key}: {len(files)} ({names})")
    if summary.get("skipped_count"):
        kinds = ", ".join(f"{k}: {v}" for k, v in (summary.get("skipped_by_kind") or {}).items())
        lines.append(f"\n⚠️ {summary['skipped_count']} files skipped ({kinds}).")
        for item in (summary.get("skipped") or [])[:10]:
            lines.append(f"- `{Path(item.get('file', '')).name}`: {item.get('reason', '')}")
    unused = 0 if video else untrained_clips(summary)
    if unused:
        from trainer_backend.families.registry import VIDEO_FAMILIES
        lines.append(f"\nℹ️ {unused} clips in the dataset are not trained: the model's family trains images only "
                     f"(a video family does: model.arch = {', '.join(VIDEO_FAMILIES)}).")
    if summary.get("filtered_count"):
        lines.append(f"\n{summary['filtered_count']} images filtered out by the metadata filters.")
    for note in summary.get("notes") or []:
        lines.append(f"\nℹ️ {note}")
    return "\n".join(lines)


def buckets_frame(summary: dict) -> pd.DataFrame:
    rows = summary.get("buckets") or []
    return pd.DataFrame({"bucket": [r.get("bucket", f"{r.get('width')}x{r.get('height')}") for r in rows],
                         "images": [int(r.get("images", 0)) for r in rows]})


def tags_frame(summary: dict) -> pd.DataFrame:
    tags = summary.get("top_tags") or []
    return pd.DataFrame({"tag": [t[0] for t in tags], "count": [int(t[1]) for t in tags]})


def name_tail(name: str, width: int = 22) -> str:
    """A file name as a caption: its end (where names differ: img_0012.png), not its start."""
    return name if len(name) <= width else "…" + name[-(width - 1):]


def _thumbnail(path: Path, size: int, max_megapixels: float):
    """A PIL RGB thumbnail, or None for a file above max_megapixels, an unreadable or hostile one."""
    import warnings

    from PIL import Image
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            im = Image.open(path)
        with im:
            if im.width * im.height > max_megapixels * 1e6:
                return None
            im.draft("RGB", (size, size))
            im.thumbnail((size, size))
            return im.convert("RGB")
    except Exception:  # PIL's own bomb guard above ~179 MP, truncated or hostile files
        return None


def side_by_side(image, *controls, gap: int = 4):
    """One picture of a pair: the training image on the left, its control (reference) images to its right."""
    from PIL import Image
    parts = (image, *controls)
    out = Image.new("RGB", (sum(p.width for p in parts) + gap * len(controls), max(p.height for p in parts)),
                    (255, 255, 255))
    x = 0
    for part in parts:
        out.paste(part, (x, 0))
        x += part.width + gap
    return out


def pair_thumbnails(summary: dict, limit: int = 24, size: int = 160, max_megapixels: float = 100.0) -> list:
    """(image | control …) side-by-side thumbnails of the pairs the scan matched (summary["control_pairs"]:
    each image with its one to three reference images)."""
    out = []
    for image_path, *control_paths in (summary.get("control_pairs") or [])[:limit]:
        image = _thumbnail(Path(image_path), size, max_megapixels)
        controls = [_thumbnail(Path(p), size, max_megapixels) for p in control_paths] if image is not None else [None]
        if controls and all(c is not None for c in controls):
            label = " | control" if len(controls) == 1 else f" | {len(controls)} references"
            out.append((side_by_side(image, *controls), name_tail(Path(image_path).name) + label))
    return out


def thumbnails(summary: dict, limit: int = 24, size: int = 160, max_megapixels: float = 100.0) -> list:
    """PIL thumbnails of the first images of each subset (PIL objects, so any folder works
    without widening the server's allowed file paths); for a paired dataset, each image beside its
    control image. Images above dataset.max_image_megapixels (the trainer skips them too),
    unreadable files and anything but regular files are left out: one such file never breaks the page."""
    if summary.get("control_pairs"):
        return pair_thumbnails(summary, limit, size, max_megapixels)
    out = []
    for s in summary.get("subsets", []):
        folder = Path(s.get("path", ""))
        if not folder.is_dir():
            continue
        files = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
        for p in files[:max(1, limit // max(1, len(summary.get("subsets", []))))]:
            thumb = _thumbnail(p, size, max_megapixels)
            if thumb is not None:
                out.append((thumb, name_tail(p.name)))
            if len(out) >= limit:
                return out
    if summary.get("video"):   # a video family's clips: their first frames, labelled with their length
        out += clip_thumbnails(summary, min(12, limit - len(out)), size)
    return out


# ----------------------------------------------------------------------------- plan

def _cell(value) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


_FAMILY_CACHE: dict[tuple, str] = {}
DETECT = ("import sys\nfrom trainer_backend.families import detect_family\n"
          "print(detect_family(sys.argv[1]).name)")


def model_family(cfg: TrainConfig, python: str = sys.executable, cwd: str | Path | None = None) -> str:
    """The family the planner plans for: model.arch, a builtin name's or a folder's (launch/model_size.py,
    pure), else a single model file's as the trainer detects it from its keys (families.detect_family, in
    a subprocess: the families import torch), cached per file; "auto" when nothing says."""
    from trainer_backend.config.paths import resolve_path
    from trainer_backend.launch.model_size import planning_arch
    arch = planning_arch(cfg)
    path = Path(resolve_path(cfg.model.path)).expanduser() if cfg.model.path else None
    if arch != "auto" or path is None or not path.is_file():
        return arch
    stat = path.stat()
    key = (str(path.resolve()), stat.st_mtime_ns, stat.st_size)
    if key not in _FAMILY_CACHE:
        try:
            proc = subprocess.run([python, "-c", DETECT, str(path)], capture_output=True, text=True, cwd=cwd,
                                  timeout=INSPECT_TIMEOUT_S, stdin=subprocess.DEVNULL)
            name = proc.stdout.strip().splitlines()[-1] if proc.returncode == 0 and proc.stdout.strip() else ""
        except (OSError, subprocess.TimeoutExpired):
            name = ""
        _FAMILY_CACHE[key] = name or "auto"
    return _FAMILY_CACHE[key]


def plan_markdown(cfg: TrainConfig, counts, summary: dict | None = None, arch: str | None = None) -> str:
    """1 GPU vs N side by side (rows and labels from the plan's own columns), the automatic
    adjustment in words, the plan's warnings, then the memory plan (peak GPU memory at the dataset's
    largest bucket, a verdict for the card, what would make it fit)."""
    from dataclasses import fields

    from trainer_backend.config.caching import auto_caching, with_auto_caching
    from trainer_backend.launch.plan import PlanColumn, plan_from_config
    caching = auto_caching(cfg)
    cfg = with_auto_caching(cfg)  # what the trainer will cache: the memory plan counts it
    plan = plan_from_config(cfg, counts)
    n = plan.num_processes
    head = f"{n} GPUs ({plan.policy})" if n > 1 else "this run"
    lines = [f"| | 1 GPU | {head} |", "|---|---:|---:|"]
    for f in fields(PlanColumn):
        if f.name == "num_processes":
            continue
        a, b = getattr(plan.single, f.name), getattr(plan.multi, f.name)
        mark = " ◀" if n > 1 and a != b else ""
        lines.append(f"| {f.metadata.get('label', f.name)} | {_cell(a)} | {_cell(b)}{mark} |")
    lines.append("")
    lines.append(f"Length in {plan.length_unit}.")
    if plan.adjustment:
        lines += ["", f"**{plan.adjustment}**"]
    for w in plan.warnings:
        lines += ["", f"⚠️ {w}"]
    if n == 1:
        lines += ["", "Set hardware.num_processes above 1 to see what more GPUs change."]
    lines += ["", f"Caching: {caching.summary()}."]
    from trainer_backend.launch.memory_advice import memory_lines
    lines += ["", "#### GPU memory", ""]
    lines += [f"{line}  " for line in memory_lines(cfg, arch, buckets=summary_buckets(summary), markdown=True)]
    from gui.hub_plan import downloads_markdown
    return "\n".join(lines + downloads_markdown(cfg))


def memory_only_markdown(cfg: TrainConfig, arch: str | None = None) -> str:
    """The plan without a dataset that can be scanned: the step counts need one, the memory plan does
    not (it is planned at dataset.resolution², the largest bucket once the images are known)."""
    from trainer_backend.launch.memory_advice import memory_lines
    lines = ["The step plan needs a dataset that can be scanned (the images, repeats and buckets give the "
             "step count).", "", "#### GPU memory", "",
             f"Planned at dataset.resolution = {cfg.dataset.resolution} (the largest bucket, once the dataset "
             f"is scanned).  "]
    lines += [f"{line}  " for line in memory_lines(cfg, arch, markdown=True)]
    from gui.hub_plan import downloads_markdown
    return "\n".join(lines + downloads_markdown(cfg))


def summary_buckets(summary: dict | None) -> list[tuple[int, int]]:
    """(width, height) of the buckets the dataset uses, from the inspector's summary."""
    return [(b["width"], b["height"]) for b in (summary or {}).get("buckets", []) if b.get("samples", 1)]


START_CONFIRM_S = 120.0


def start_memory_warning(cfg: TrainConfig, warned_at: float | None, now: float, arch: str | None = None) -> str:
    """The warning Start shows (instead of starting) when the memory plan says the run will not fit
    the card; "" when it fits, or when the user was warned less than START_CONFIRM_S ago and pressed
    Start again (start anyway)."""
    if warned_at and now - warned_at < START_CONFIRM_S:
        return ""
    from trainer_backend.launch.memory_advice import will_not_fit
    message = will_not_fit(cfg, arch)
    return f"{message} Press Start again within {START_CONFIRM_S:.0f} s to start anyway." if message else ""
