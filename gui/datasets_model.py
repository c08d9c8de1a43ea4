"""What the Datasets page shows, without Gradio: one dataset's items (every image, indexed or
not yet), filters, pages, the detail picture with the trainer's crop drawn, and the background
indexer (`python -m trainer_backend dataset index`, one process per folder: thumbnails and
hashes are made there, never in the studio's process).

The view is rebuilt only when the index grew, a caption was saved or the settings changed, so a
page change is a slice of a list."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

from PIL import Image, ImageDraw

from trainer_backend.data.buckets import bucket_name
from trainer_backend.data.images import BadImage, load_rgb
from trainer_backend.workbench import (CheckSettings, annotate, crop_of, entries, read_index, tag_frequency,
                                       thumb_path)
from trainer_backend.workbench.checks import FLAG_KINDS, pair_flags
from trainer_backend.workbench.clips import family_of, is_clip_name, options_of, windows_summary
from trainer_backend.workbench.index import index_path, is_current, list_media

PAGE_SIZE = 60
DETAIL_SIDE = 768
FLAG_LABELS = {"unreadable": "unreadable", "too_small": "too small", "extreme_aspect": "extreme aspect",
               "crop_cuts": "crop cuts > 1/3", "exif_rotated": "EXIF-rotated", "cmyk": "CMYK", "alpha": "alpha",
               "sixteen_bit": "16-bit", "palette": "palette", "animated": "animated", "duplicate": "exact duplicate",
               "near_duplicate": "near duplicate", "uncaptioned": "uncaptioned", "caption": "caption problem",
               "control_missing": "no control image (caption only)", "control_size": "control size differs"}
assert set(FLAG_LABELS) == set(FLAG_KINDS)


@dataclass
class View:
    folder: Path
    settings: CheckSettings
    items: list[dict]
    groups: list[dict]
    indexed: int
    stamp: tuple = ()
    tags: list[tuple[str, int]] = field(default_factory=list)
    # clips: the Training form's family (name, label, frame step: 0 = trains images only), its video
    # options and the clips scan's summary (data/video_scan.py's keys) of the indexed clips and images
    family: tuple[str, str, int] = ("auto", "", 0)
    video_options: object = None
    clip_summary: dict | None = None
    video_problem: str = ""          # a video option of the form the schema refuses (no windows then)

    def clip_count(self) -> int:
        return sum(1 for i in self.items if is_clip_name(i["path"]))

    def filtered(self, flag: str = "", tag: str = "", bucket: str = "") -> list[int]:
        """Indices of the items passing the filters ("" = any)."""
        tag = tag.strip()
        out = []
        for i, item in enumerate(self.items):
            if flag in ("clips", "images"):
                if is_clip_name(item["path"]) != (flag == "clips"):
                    continue
            elif flag == "flagged" and not item["flags"]:
                continue
            elif flag and flag != "flagged" and flag not in item["flags"]:
                continue
            if tag and tag not in [t.strip() for t in (item.get("caption") or "").split(",")]:
                continue
            if bucket and item.get("bucket") != bucket:
                continue
            out.append(i)
        return out

    def counts(self) -> dict[str, int]:
        out = {k: 0 for k in FLAG_KINDS}
        for item in self.items:
            for k in item["flags"]:
                out[k] = out.get(k, 0) + 1
        return out

    def buckets(self) -> list[str]:
        return sorted({i["bucket"] for i in self.items if "bucket" in i}, key=lambda b: [int(x) for x in b.split("x")])


class Views:
    """One View per folder and settings, rebuilt when its index or captions changed."""

    def __init__(self, cache: Path):
        self.cache = Path(cache)
        self._views: dict[tuple, View] = {}
        self._lock = threading.Lock()

    def _stamp(self, folder: Path) -> tuple:
        def mtime(p: Path) -> int:
            try:
                return p.stat().st_mtime_ns
            except OSError:
                return 0
        journal = entries(folder)
        return (mtime(index_path(self.cache, folder)), mtime(folder), journal[0].id if journal else "",
                sum(e.undone for e in journal))

    def get(self, folder: Path, settings: CheckSettings, control_root: str = "", force: bool = False,
            video: dict | None = None) -> View:
        """`video`: the Training form's model.arch / model.path and [dataset] video_* values (what a clip's
        windows depend on)."""
        folder = Path(folder)
        video = video or {}
        key = (str(folder), settings, control_root, json.dumps(video, sort_keys=True, default=str))
        stamp = self._stamp(folder)
        with self._lock:
            view = self._views.get(key)
            if view is not None and view.stamp == stamp and not force:
                return view
            known = read_index(self.cache, folder)
            records = []
            for path in list_media(folder):
                rel = path.relative_to(folder).as_posix()
                record = known.get(rel)
                records.append(record if is_current(record, path) else {"path": rel, "flags": {}, "pending": True})
            items, groups = annotate(folder, records, settings)
            if control_root and Path(control_root).is_dir():
                pairs = pair_flags(folder, Path(control_root), records)
                for item in items:
                    extra = pairs.get(item["path"], {})
                    item["controls"] = extra.get("controls", [])
                    item["flags"].update({k: v for k, v in extra.items() if k != "controls"})
            arch, step = family_of(video)
            problem = ""
            try:
                opts = options_of(video, step) if step else None
            except ValueError as e:   # the Training page names the field too; here the windows wait for it
                opts, problem = None, str(e)
            summary = None
            if opts is not None and any(is_clip_name(r["path"]) for r in records):
                summary = windows_summary(folder, records, opts, settings.spec_and_buckets()[0])
            view = View(folder, settings, items, groups, sum(1 for r in records if not r.get("pending")), stamp,
                        tag_frequency([i.get("caption") for i in items]), (arch, family_label(arch), step), opts,
                        summary, problem)
            self._views[key] = view
            return view


def family_label(arch: str) -> str:
    from trainer_backend.families.registry import FAMILY_NAMES, entry
    return entry(arch).label if arch in FAMILY_NAMES else ""


def page_of(indices: list[int], page: int, size: int = PAGE_SIZE) -> tuple[list[int], int, int]:
    """(the page's indices, the page clamped to what exists, the number of pages)."""
    pages = max(1, -(-len(indices) // size))
    page = min(max(0, page), pages - 1)
    return indices[page * size:(page + 1) * size], page, pages


def thumb_or_placeholder(cache: Path, item: dict) -> str:
    if "sha256" in item:
        path = thumb_path(cache, item["sha256"])
        if path.exists():
            return str(path)
    return str(placeholder(cache, "unreadable" if "unreadable" in item["flags"] else "pending"))


def placeholder(cache: Path, kind: str) -> Path:
    path = Path(cache) / "thumbs" / f"placeholder-{kind}.png"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        img = Image.new("RGB", (64, 64), (235, 235, 235) if kind == "pending" else (240, 200, 200))
        ImageDraw.Draw(img).text((8, 26), "…" if kind == "pending" else "bad", fill=(120, 120, 120))
        img.save(path)
    return path


def grid_label(item: dict) -> str:
    name = Path(item["path"]).name
    marks = ", ".join(FLAG_LABELS[k] for k in item["flags"] if k in FLAG_LABELS)
    return f"{name}" + (f" ⚠ {marks}" if marks else "")


def detail_picture(folder: Path, item: dict, settings: CheckSettings) -> tuple[Image.Image | None, str]:
    """The image (upright, at most DETAIL_SIDE) with the trainer's crop drawn on it, and its description."""
    lines = [f"**{item['path']}**"]
    if "width" not in item:
        lines.append("not indexed yet" if item.get("pending") else "")
    picture = None
    if "width" in item:
        w, h = item["width"], item["height"]
        bucket, crop = crop_of(w, h, settings)
        lines.append(f"{w}×{h} px · bucket {bucket_name(bucket)} · the crop keeps {crop.kept:.0%}"
                     + ("" if settings.center_crop else " (random crop: the centred one of the crops it may take)"))
        try:
            img = load_rgb(folder / item["path"], 10**9, draft=(DETAIL_SIDE, DETAIL_SIDE))
            scale = DETAIL_SIDE / max(img.size)   # small images are enlarged too, so the crop can be seen
            img = img.resize((max(1, round(img.width * scale)), max(1, round(img.height * scale))),
                             Image.Resampling.LANCZOS if scale < 1 else Image.Resampling.NEAREST)
            sx, sy = img.width / w, img.height / h
            left, top, right, bottom = crop.box
            shade = Image.new("RGBA", img.size, (0, 0, 0, 110))
            ImageDraw.Draw(shade).rectangle((left * sx, top * sy, right * sx - 1, bottom * sy - 1), fill=(0, 0, 0, 0))
            picture = Image.alpha_composite(img.convert("RGBA"), shade).convert("RGB")
            ImageDraw.Draw(picture).rectangle((left * sx, top * sy, right * sx - 1, bottom * sy - 1),
                                              outline=(255, 60, 60), width=max(2, round(2 * max(img.size) / 512)))
        except BadImage as e:
            lines.append(f"cannot be shown: {e}")
    for kind, message in item["flags"].items():
        lines.append(f"- ⚠ **{FLAG_LABELS.get(kind, kind)}**: {message}")
    return picture, "\n".join(lines)


class Indexer:
    """The background indexing processes, one per folder (started when a dataset is opened)."""

    def __init__(self, cache: Path, python: str = sys.executable):
        self.cache, self.python = Path(cache), python
        self._procs: dict[str, subprocess.Popen] = {}
        self._lock = threading.Lock()

    def ensure(self, folder: Path) -> None:
        key = os.path.realpath(folder)
        with self._lock:
            proc = self._procs.get(key)
            if proc is not None and proc.poll() is None:
                return
            self.cache.mkdir(parents=True, exist_ok=True)
            log = open(self.cache / "indexer.log", "ab")
            self._procs[key] = subprocess.Popen(
                [self.python, "-m", "trainer_backend", "dataset", "index", str(folder), "--cache", str(self.cache)],
                stdout=subprocess.DEVNULL, stderr=log, stdin=subprocess.DEVNULL, cwd=Path(__file__).resolve().parent.parent,
                env={**os.environ, "PYTHONPATH": os.pathsep.join(
                    p for p in (str(Path(__file__).resolve().parent.parent), os.environ.get("PYTHONPATH", "")) if p)})
            log.close()

    def running(self, folder: Path) -> bool:
        proc = self._procs.get(os.path.realpath(folder))
        return proc is not None and proc.poll() is None

    def stop_all(self) -> None:
        for proc in self._procs.values():
            if proc.poll() is None:
                proc.terminate()
