"""The dataset's undo journal: every change to a caption (or any text file of the dataset) goes
through `apply`, which records the previous bytes (or their absence) before it writes, so `undo`
can put them back.

    entry_id = apply(dataset_dir, {dataset_dir / "a.txt": "ohwx, a dog", dataset_dir / "b.txt": None}, "trigger word")
    undo(dataset_dir)             # the newest entry not yet undone
    undo(dataset_dir, entry_id)   # a given one

The journal lives in `<dataset>/.workbench/journal/` (a dot folder: the trainer's scan skips it),
one JSON file per entry, written (and fsynced) before any caption file changes, so an apply cut off
half way is still undoable. Files are written atomically (temporary file + rename in the same
folder). Previous contents are kept as bytes (base64 when not UTF-8), so a caption in another
encoding comes back exactly. A lock file serialises writers (two browser tabs, the CLI and a caption
job). Undo refuses, changing nothing, when a file changed since the entry (someone edited it
after); `force=True` overrides and keeps the overwritten text in the undone entry.

Pure standard library: the CLI, the studio page and the captioners all call it.
"""
from __future__ import annotations

import base64
import fcntl
import json
import os
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

WORKBENCH_DIR = ".workbench"
JOURNAL_DIR = "journal"
UNDONE_SUFFIX = ".undone.json"


class JournalError(ValueError):
    """A change or undo that cannot be made; the message is one line naming the file. Nothing was changed."""


@dataclass(frozen=True)
class Entry:
    id: str
    label: str
    time: float
    files: int
    undone: bool


def journal_dir(dataset_dir: Path) -> Path:
    return Path(dataset_dir) / WORKBENCH_DIR / JOURNAL_DIR


def _encode(data: bytes | None) -> dict:
    if data is None:
        return {"absent": True}
    try:
        return {"text": data.decode("utf-8")}
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(data).decode("ascii")}


def _decode(record: dict) -> bytes | None:
    if record.get("absent"):
        return None
    if "base64" in record:
        return base64.b64decode(record["base64"])
    return str(record["text"]).encode("utf-8")


def _read_bytes(path: Path) -> bytes | None:
    try:
        if path.exists() and not path.is_file():
            raise JournalError(f"{path}: not a regular file; it is left alone")
        return path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise JournalError(f"{path}: cannot be read ({e.strerror or e})") from None


def _relative(dataset_dir: Path, path: Path) -> str:
    """The path inside the dataset (refuses one outside it, a folder, or one in the journal)."""
    path = Path(path)
    full = path if path.is_absolute() else dataset_dir / path
    try:
        rel = Path(os.path.realpath(full)).relative_to(os.path.realpath(dataset_dir))
    except ValueError:
        raise JournalError(f"{path}: outside the dataset folder {dataset_dir}; nothing was changed") from None
    if not rel.parts or rel.parts[0] == WORKBENCH_DIR:
        raise JournalError(f"{path}: not a caption file of the dataset; nothing was changed")
    return rel.as_posix()


def write_atomic(path: Path, data: bytes | None) -> None:
    """Replace path's content (None: remove it) so a reader sees the old or the new file, never half of one."""
    if data is None:
        try:
            path.unlink()
        except FileNotFoundError:
            pass
        return
    try:
        mode = path.stat().st_mode & 0o777
    except FileNotFoundError:
        mode = 0o666 & ~_umask()
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextmanager
def _locked(dataset_dir: Path):
    folder = journal_dir(dataset_dir)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        handle = open(folder / ".lock", "a")
    except OSError as e:
        raise JournalError(f"{dataset_dir}: the dataset folder is not writable ({e.strerror or e}); "
                           f"nothing was changed") from None
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield folder
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _next_id(folder: Path) -> str:
    numbers = [int(p.name.split("-", 1)[0]) for p in folder.glob("*.json") if p.name.split("-", 1)[0].isdigit()]
    return f"{max(numbers, default=0) + 1:06d}-{time.strftime('%Y%m%dT%H%M%S')}"


def _write_json(path: Path, obj: dict) -> None:
    write_atomic(path, json.dumps(obj, ensure_ascii=False, indent=1).encode("utf-8"))


def apply(dataset_dir: Path, changes: dict[Path, str | None], label: str, *,
          expected: dict[Path, str | None] | None = None) -> str:
    """Write each file's new text (None: remove the file) and journal what was there; returns the
    entry id. `expected` (optional) maps paths to the text the caller last read: when a file holds
    something else now (another tab saved it), nothing is written and JournalError names it.
    An empty `changes` writes nothing and returns ''."""
    dataset_dir = Path(dataset_dir)
    if not dataset_dir.is_dir():
        raise JournalError(f"{dataset_dir}: no such dataset folder")
    targets = {_relative(dataset_dir, p): text for p, text in changes.items()}
    if not targets:
        return ""
    wanted = {_relative(dataset_dir, p): t for p, t in (expected or {}).items()}
    with _locked(dataset_dir) as folder:
        files = []
        for rel, text in sorted(targets.items()):
            path = dataset_dir / rel
            before = _read_bytes(path)
            if rel in wanted:
                now = None if before is None else before.removeprefix(b"\xef\xbb\xbf").decode("utf-8", errors="replace")
                if now != wanted[rel]:
                    raise JournalError(f"{rel}: changed since it was loaded (another tab or program saved it); "
                                       f"reload it; nothing was changed")
            if text is not None and not path.parent.is_dir():
                raise JournalError(f"{rel}: its folder does not exist; nothing was changed")
            if not os.access(path.parent, os.W_OK):
                raise JournalError(f"{rel}: the folder is read-only; nothing was changed")
            after = None if text is None else text.encode("utf-8")
            files.append({"path": rel, "before": _encode(before), "after": _encode(after)})
        entry_id = _next_id(folder)
        _write_json(folder / f"{entry_id}.json", {"id": entry_id, "label": label, "time": time.time(), "files": files})
        for record in files:
            write_atomic(dataset_dir / record["path"], _decode(record["after"]))
        return entry_id


def entries(dataset_dir: Path) -> list[Entry]:
    """The journal, newest first."""
    folder = journal_dir(dataset_dir)
    out = []
    for path in folder.glob("*.json") if folder.is_dir() else []:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        out.append(Entry(data["id"], data.get("label", ""), data.get("time", 0.0), len(data.get("files", [])),
                         path.name.endswith(UNDONE_SUFFIX)))
    return sorted(out, key=lambda e: e.id, reverse=True)


def undo(dataset_dir: Path, entry_id: str | None = None, *, force: bool = False) -> Entry:
    """Put back what the newest not-undone entry (or `entry_id`) replaced; returns that entry.
    Refuses, changing nothing, when a file no longer holds what the entry wrote (unless force)."""
    dataset_dir = Path(dataset_dir)
    with _locked(dataset_dir) as folder:
        if entry_id is None:
            open_entries = [e for e in entries(dataset_dir) if not e.undone]
            if not open_entries:
                raise JournalError(f"{dataset_dir}: nothing to undo")
            entry_id = open_entries[0].id
        path = folder / f"{entry_id}.json"
        if not path.is_file():
            if (folder / f"{entry_id}{UNDONE_SUFFIX}").is_file():
                raise JournalError(f"{entry_id}: already undone")
            raise JournalError(f"{entry_id}: no such journal entry in {dataset_dir}")
        data = json.loads(path.read_text(encoding="utf-8"))
        overwritten = []
        for record in data["files"]:
            now = _read_bytes(dataset_dir / record["path"])
            if now != _decode(record["after"]):
                if not force:
                    raise JournalError(f"{record['path']}: changed after '{data.get('label', entry_id)}'; undoing "
                                       f"would lose that change; nothing was changed")
                overwritten.append({"path": record["path"], "text": _encode(now)})
        data["undone_time"] = time.time()
        if overwritten:
            data["overwritten_by_undo"] = overwritten
        _write_json(folder / f"{entry_id}{UNDONE_SUFFIX}", data)
        path.unlink()
        for record in data["files"]:
            target = dataset_dir / record["path"]
            before = _decode(record["before"])
            if before is not None:
                target.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(target, before)
        return Entry(entry_id, data.get("label", ""), data.get("time", 0.0), len(data["files"]), True)
