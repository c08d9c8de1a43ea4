"""Which images a caption job captions (pure apart from reading the folder and the job's ledger).

The dataset's images (subfolders too; dot folders such as .workbench are skipped), sorted; an image
is pending unless this job already captioned it (its ledger, `captioned.jsonl` in the job folder:
a second start continues where the first stopped) or it has a caption and the policy is "skip".
A caption file that is empty or only whitespace counts as no caption."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..data.images import IMAGE_EXTENSIONS

LEDGER = "captioned.jsonl"


@dataclass(frozen=True)
class WorkItem:
    image: Path          # absolute
    rel: str             # relative to the dataset, "/"-separated (the ledger's key)
    caption_file: Path
    existing: str | None  # the caption file's text as it is on disk (None: no file)


def dataset_images(dataset: Path) -> list[Path]:
    found = []
    for path in sorted(Path(dataset).rglob("*")):
        rel = path.relative_to(dataset)
        if any(part.startswith(".") for part in rel.parts) or path.suffix.lower() not in IMAGE_EXTENSIONS:
            continue
        if path.is_file():
            found.append(path)
    return found


def read_text(path: Path) -> str | None:
    try:
        return path.read_bytes().decode("utf-8", errors="replace")
    except (FileNotFoundError, IsADirectoryError):
        return None


def read_ledger(job_dir: Path) -> dict[str, dict]:
    """rel -> the ledger record of each image this job captioned (a torn last line is ignored)."""
    done = {}
    try:
        lines = (Path(job_dir) / LEDGER).read_text(encoding="utf-8").splitlines()
    except OSError:
        return done
    for line in lines:
        try:
            record = json.loads(line)
            done[record["image"]] = record
        except (ValueError, KeyError, TypeError):
            continue
    return done


def append_ledger(job_dir: Path, records: list[dict]) -> None:
    import os
    with open(Path(job_dir) / LEDGER, "a", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
        f.flush()
        os.fsync(f.fileno())


def worklist(dataset: Path, extension: str, policy: str, done: dict[str, dict]) -> tuple[list[WorkItem], int]:
    """(images to caption now, images of the dataset this job already captioned)."""
    dataset = Path(dataset)
    pending, already = [], 0
    for image in dataset_images(dataset):
        rel = image.relative_to(dataset).as_posix()
        if rel in done:
            already += 1
            continue
        caption_file = image.with_suffix(extension)
        existing = read_text(caption_file)
        if policy == "skip" and existing is not None and existing.strip():
            continue
        pending.append(WorkItem(image, rel, caption_file, existing))
    return pending, already
