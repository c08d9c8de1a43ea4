"""Metadata JSON mode: image-board style records `{"tags": [...], "score": n, "path": "rel/img.png"}`.

Records come from one JSON file (an object or a list of objects) or a folder tree of them. The
filters and tag transforms are pure functions of a record and the options, so they are tested
without files. Extra keys in a record are ignored.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from ..config import ConfigError, Dataset
from .images import IMAGE_EXTENSIONS


@dataclass(frozen=True)
class TagOptions:
    ignore_tags: frozenset[str]
    remove_tags: frozenset[str]
    replace_tags: tuple[tuple[str, str], ...]
    abs_min_score: float
    min_score: float
    tag_bonus_scores: dict[str, float]
    score_tags: tuple[int, ...]        # descending
    score_tag_prefix: str

    @classmethod
    def from_config(cls, ds: Dataset) -> "TagOptions":
        return cls(frozenset(ds.ignore_tags), frozenset(ds.remove_tags), tuple(ds.replace_tags.items()),
                   ds.abs_min_score, ds.min_score, dict(ds.tag_bonus_scores),
                   tuple(sorted(ds.score_tags, reverse=True)), ds.score_tag_prefix)


@dataclass(frozen=True)
class Record:
    source: Path          # the JSON file
    tags: tuple[str, ...]
    score: float | None
    path: str | None


def filter_reason(record: Record, opts: TagOptions) -> str:
    """Why a record is filtered out ("" = kept). Ignored tags are matched before any transform."""
    hit = next((t for t in record.tags if t in opts.ignore_tags), None)
    if hit is not None:
        return f"has ignored tag '{hit}'"
    score = record.score if record.score is not None else 0.0
    if opts.abs_min_score and score < opts.abs_min_score:
        return f"score {score:g} below abs_min_score {opts.abs_min_score:g}"
    if opts.min_score:
        adjusted = score + sum(opts.tag_bonus_scores.get(t, 0.0) for t in record.tags)
        if adjusted < opts.min_score:
            return f"score {adjusted:g} (with tag bonuses) below min_score {opts.min_score:g}"
    return ""


def transform_tags(record: Record, opts: TagOptions) -> list[str]:
    """Removed tags dropped, replacements applied in order, the score tag appended."""
    tags = []
    for tag in record.tags:
        if tag in opts.remove_tags:
            continue
        for old, new in opts.replace_tags:
            tag = tag.replace(old, new)
        if tag:
            tags.append(tag)
    if record.score is not None:
        for threshold in opts.score_tags:
            if record.score > threshold:
                tags.append(f"{opts.score_tag_prefix}{threshold}")
                break
    return tags


def _as_record(obj: object, source: Path) -> Record:
    if not isinstance(obj, dict):
        raise ValueError("record is not a JSON object")
    tags = obj.get("tags", [])
    if isinstance(tags, str):
        tags = [t.strip() for t in tags.split(",") if t.strip()]
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        raise ValueError("'tags' is not a list of strings")
    score = obj.get("score")
    if score is not None and (isinstance(score, bool) or not isinstance(score, (int, float))):
        raise ValueError("'score' is not a number")
    path = obj.get("path")
    if path is not None and not isinstance(path, str):
        raise ValueError("'path' is not a string")
    return Record(source, tuple(t.strip() for t in tags if t.strip()), None if score is None else float(score), path)


def json_files(location: Path, problems: list[tuple[Path, str]]) -> list[Path]:
    """location itself if it is a file, else every *.json below it (sorted, symlink loops skipped)."""
    if location.is_file():
        return [location]
    out, seen = [], set()
    for dirpath, dirnames, filenames in os.walk(location, followlinks=True):
        try:
            st = os.stat(dirpath)
        except OSError as e:
            problems.append((Path(dirpath), f"unreadable folder ({e.strerror or e})"))
            dirnames[:] = []
            continue
        if (st.st_dev, st.st_ino) in seen:
            problems.append((Path(dirpath), "symlink loop (folder already visited)"))
            dirnames[:] = []
            continue
        seen.add((st.st_dev, st.st_ino))
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        out += [Path(dirpath) / f for f in sorted(filenames) if f.lower().endswith(".json")]
    return sorted(out)


def read_records(files: list[Path], problems: list[tuple[Path, str]]) -> list[Record]:
    """Records of every file in order; malformed files or records are reported and skipped."""
    records = []
    for path in files:
        try:
            data = json.loads(path.read_bytes())
        except OSError as e:
            problems.append((path, f"metadata unreadable ({e.strerror or e})"))
            continue
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            problems.append((path, f"metadata is not valid JSON ({e})"))
            continue
        except RecursionError:  # thousands of nested brackets: skip the file, never abort the scan
            problems.append((path, "metadata is nested too deeply to read (skipped)"))
            continue
        items = data if isinstance(data, list) else [data]
        for n, obj in enumerate(items):
            try:
                records.append(_as_record(obj, path))
            except ValueError as e:
                where = f" (record {n})" if isinstance(data, list) else ""
                problems.append((path, f"metadata malformed{where}: {e}"))
    return records


def image_of(record: Record, root: Path) -> tuple[Path | None, str]:
    """The image a record points to, or (None, why). Paths are relative to the dataset root and
    must stay inside it; a record without "path" uses the same-named image next to its JSON."""
    real_root = root.resolve()
    if record.path is None:
        for ext in sorted(IMAGE_EXTENSIONS):
            candidate = record.source.with_suffix(ext)
            if candidate.is_file():
                return candidate, ""
        return None, "metadata has no 'path' and no same-named image beside it"
    rel = Path(record.path)
    if rel.is_absolute() or record.path.startswith(("/", "\\")):
        return None, f"metadata path '{record.path}' is absolute (must be relative to the dataset root)"
    target = (root / rel)
    try:
        resolved = target.resolve()
    except (OSError, RuntimeError) as e:
        return None, f"metadata path '{record.path}' cannot be resolved ({e})"
    if not resolved.is_relative_to(real_root):
        return None, f"metadata path '{record.path}' points outside the dataset root"
    if not target.is_file():
        return None, f"metadata path '{record.path}': image not found"
    return target, ""


def metadata_location(root: Path, metadata_path: str, key: str) -> Path:
    location = Path(metadata_path).expanduser() if metadata_path else root
    if not location.exists():
        raise ConfigError(f"{key.rsplit('.', 1)[0]}.metadata_path: not found: {location}")
    return location
