"""Captions kept in metadata JSON (data/metadata.py's records `{"tags": [...], "path": ...}`): a
dataset whose folder holds such records has its captions there, not in caption files. The
workbench reads an image's caption as its record's tags joined with ", ", and saves an edit by
rewriting that record's `tags` in its JSON file through the journal (bulk edits rewrite each
JSON file once for all its changed records) (the whole file's previous
text is kept, so Undo restores it exactly; other keys and records are kept)."""
from __future__ import annotations

import json
from pathlib import Path

from ..data.captions import join_tags, split_tags
from ..data.metadata import Record, image_of, json_files
from .journal import WORKBENCH_DIR, JournalError, apply


def _records(data) -> list[tuple[int | None, dict]]:
    if isinstance(data, list):
        return [(n, obj) for n, obj in enumerate(data) if isinstance(obj, dict)]
    return [(None, data)] if isinstance(data, dict) else []


def _tags(obj: dict) -> tuple[str, ...]:
    tags = obj.get("tags", [])
    if isinstance(tags, str):
        tags = split_tags(tags, ",")
    return tuple(t.strip() for t in tags if isinstance(t, str) and t.strip())


def metadata_index(folder: Path) -> dict[str, tuple[Path, int | None, str]]:
    """image path (relative) -> (its JSON file, the record's position in a list or None, the caption)."""
    folder = Path(folder)
    out: dict[str, tuple[Path, int | None, str]] = {}
    for path in json_files(folder, []):
        if WORKBENCH_DIR in path.relative_to(folder).parts:
            continue
        try:
            data = json.loads(path.read_bytes())
        except (OSError, ValueError, RecursionError):
            continue
        for position, obj in _records(data):
            if "tags" not in obj:
                continue
            raw_path = obj.get("path")
            image, _ = image_of(Record(path, (), None, raw_path if isinstance(raw_path, str) else None), folder)
            if image is not None:
                out[image.relative_to(folder).as_posix()] = (path, position, join_tags(list(_tags(obj)), ","))
    return out


def rewrite_metadata_captions(path: Path, new_captions: dict[int | None, str]) -> tuple[str, str]:
    """(the JSON file's text now, its text with the records at those positions given these captions as
    tags); other keys and records are kept as they are."""
    before = path.read_text(encoding="utf-8")
    data = json.loads(before)
    for position, text in new_captions.items():
        record = data[position] if position is not None else data
        record["tags"] = split_tags(text, ",")
    return before, json.dumps(data, ensure_ascii=False, indent=1) + "\n"


def save_metadata_caption(folder: Path, image_rel: str, text: str, loaded: str | None) -> str:
    """Write `text` (split into tags at commas) as the image's record's tags; refused (JournalError,
    nothing changed) when the record's caption is no longer `loaded`. Returns the journal entry id."""
    folder = Path(folder)
    found = metadata_index(folder).get(image_rel)
    if found is None:
        raise JournalError(f"{image_rel}: no metadata record of this image")
    path, position, caption = found
    if loaded is not None and caption != loaded:
        raise JournalError(f"{image_rel}: its metadata caption changed since it was loaded (another tab or program); "
                           f"reload it; nothing was changed")
    before, after = rewrite_metadata_captions(path, {position: text})
    return apply(folder, {path: after}, f"caption {Path(image_rel).name} (metadata)", expected={path: before})
