"""The datasets folder: list, create, bring images and clips in (uploaded files, a .zip, a folder
copied from disk), kohya `N_concept` subsets and their repeats, and delete.

Nothing here moves or overwrites a user's file: imports copy, a name already taken gets a
numbered name, and a dataset is deleted only when the studio created it (the marker
`.workbench/dataset.json`, as run folders have theirs: run/run_folder.py) and it holds nothing but
images, captions and the workbench's own folder. Every refusal is one line naming the file, and
refused input changes nothing: uploads and archives are checked whole (each image opened, each
zip member's path and size) before the first file is placed.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

from ..data.images import IMAGE_EXTENSIONS, BadImage, probe
from ..data.video import VIDEO_EXTENSIONS, BadClip, probe_clip
from ..data.subsets import CONCEPT_DIR
from .clips import is_clip, list_clips
from .index import DEFAULT_MAX_PIXELS, list_images
from .journal import WORKBENCH_DIR

MARKER = "dataset.json"
MARKER_KIND = "trainer-studio-dataset"
CAPTION_EXTENSIONS = frozenset({".txt", ".caption"})
MAX_ZIP_BYTES = 8 << 30          # what one archive may unpack to
MAX_ZIP_RATIO = 200              # uncompressed / compressed above this (and over 64 MiB): a zip bomb
MAX_ZIP_MEMBERS = 100_000
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 _.\-]{0,99}$")


class LibraryError(ValueError):
    """A dataset operation refused (one line naming the file or name); nothing was changed."""


@dataclass(frozen=True)
class DatasetInfo:
    name: str
    path: Path
    images: int
    captioned: int
    made_here: bool      # created by the studio (may be deleted from the page)
    clips: int = 0


def check_name(name: str, what: str = "dataset name") -> str:
    name = (name or "").strip()
    if not _NAME.match(name) or name.endswith(".") or ".." in name:
        raise LibraryError(f"{what} '{name}': use letters, digits, spaces, '_', '-' or '.' (not leading), "
                           f"at most 100 characters")
    return name


def within(path: Path, roots: list[Path]) -> bool:
    real = Path(os.path.realpath(path))
    return any(real == Path(os.path.realpath(r)) or real.is_relative_to(os.path.realpath(r)) for r in roots)


def made_here(folder: Path) -> bool:
    try:
        data = json.loads((Path(folder) / WORKBENCH_DIR / MARKER).read_text(encoding="utf-8"))
        return data.get("kind") == MARKER_KIND
    except (OSError, ValueError, AttributeError):
        return False


def count_captioned(images: list[Path], extension: str = ".txt") -> int:
    return sum(1 for p in images if p.with_suffix(extension).is_file())


def list_datasets(root: Path) -> list[DatasetInfo]:
    """The datasets (sub-folders) of the datasets folder, by name."""
    root = Path(root)
    out = []
    for folder in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")) if root.is_dir() else []:
        images, clips = list_images(folder), list_clips(folder)
        out.append(DatasetInfo(folder.name, folder, len(images), count_captioned(images + clips), made_here(folder),
                               len(clips)))
    return out


def create_dataset(root: Path, name: str) -> Path:
    folder = Path(root) / check_name(name)
    if folder.exists():
        raise LibraryError(f"dataset '{name}' already exists in {root}")
    try:
        (folder / WORKBENCH_DIR).mkdir(parents=True)
    except OSError as e:
        raise LibraryError(f"{root}: cannot create a dataset there ({e.strerror or e})") from None
    (folder / WORKBENCH_DIR / MARKER).write_text(json.dumps({"kind": MARKER_KIND, "created": time.time()}),
                                                 encoding="utf-8")
    return folder


def _free_name(folder: Path, name: str, taken: set[str]) -> Path:
    """folder/name, or name-1, name-2… when taken (never overwrite)."""
    stem, suffix = Path(name).stem, Path(name).suffix
    candidate, n = name, 0
    while (folder / candidate).exists() or candidate in taken:
        n += 1
        candidate = f"{stem}-{n}{suffix}"
    taken.add(candidate)
    return folder / candidate


def _check_image(path: Path, shown: str, max_pixels: int) -> None:
    try:
        probe(path, max_pixels)
    except BadImage as e:
        raise LibraryError(f"{shown}: {e}; nothing was added") from None


def _check_clip(path: Path, shown: str) -> None:
    """A video file opens and has frames (the scan's own probe; its reason when not)."""
    try:
        probe_clip(path)
    except BadClip as e:
        raise LibraryError(f"{shown}: {e}; nothing was added") from None


def _media(suffix: str) -> bool:
    return suffix in IMAGE_EXTENSIONS or suffix in VIDEO_EXTENSIONS


def _writable(folder: Path) -> None:
    if not os.access(folder, os.W_OK | os.X_OK):
        raise LibraryError(f"{folder}: the folder is read-only; nothing was added")


def add_files(dataset: Path, files: list[tuple[str, Path]], max_pixels: int = DEFAULT_MAX_PIXELS) -> list[Path]:
    """Copy uploaded files [(original name, temporary path)] into the dataset: images and video clips
    (each opened first) and captions beside them (a caption keeps its image's or clip's new name).
    Returns the images and clips added. Anything else, or any bad file, refuses the whole upload."""
    dataset = Path(dataset)
    _writable(dataset)
    images, captions = [], {}
    for name, path in files:
        base = Path(name).name
        suffix = Path(base).suffix.lower()
        if suffix in IMAGE_EXTENSIONS:
            _check_image(Path(path), base, max_pixels)
            images.append((base, Path(path)))
        elif suffix in VIDEO_EXTENSIONS:
            _check_clip(Path(path), base)
            images.append((base, Path(path)))
        elif suffix in CAPTION_EXTENSIONS:
            captions[Path(base).stem] = (suffix, Path(path))
        elif suffix == ".zip":
            raise LibraryError(f"{base}: add archives on their own (Upload a .zip)")
        else:
            raise LibraryError(f"{base}: not an image, a clip or a caption ({', '.join(sorted(IMAGE_EXTENSIONS))}, "
                               f"{', '.join(sorted(VIDEO_EXTENSIONS))}, .txt); nothing was added")
    taken: set[str] = set()
    added = []
    for base, path in images:
        target = _free_name(dataset, base, taken)
        shutil.copyfile(path, target)
        added.append(target)
        if Path(base).stem in captions:
            suffix, caption = captions[Path(base).stem]
            shutil.copyfile(caption, target.with_suffix(suffix))
    return added


def _zip_members(archive: zipfile.ZipFile, name: str) -> list[zipfile.ZipInfo]:
    members = [m for m in archive.infolist() if not m.is_dir()]
    if len(members) > MAX_ZIP_MEMBERS:
        raise LibraryError(f"{name}: {len(members)} files is more than {MAX_ZIP_MEMBERS}; nothing was added")
    total = compressed = 0
    for m in members:
        parts = Path(m.filename.replace("\\", "/")).parts
        if m.filename.startswith(("/", "\\")) or ".." in parts or (parts and ":" in parts[0]):
            raise LibraryError(f"{name}: member '{m.filename}' points outside the dataset (zip-slip); nothing was added")
        if (m.external_attr >> 16) & 0o170000 == 0o120000:
            raise LibraryError(f"{name}: member '{m.filename}' is a symbolic link; nothing was added")
        total += m.file_size
        compressed += m.compress_size
    if total > MAX_ZIP_BYTES or (total > 64 << 20 and total > MAX_ZIP_RATIO * max(compressed, 1)):
        raise LibraryError(f"{name}: unpacks to {total / 2**20:.0f} MiB from {compressed / 2**20:.1f} MiB "
                           f"(a zip bomb?); nothing was added")
    return members


def add_zip(dataset: Path, zip_path: Path, shown_name: str = "", max_pixels: int = DEFAULT_MAX_PIXELS) -> list[Path]:
    """Unpack a .zip's images and captions into the dataset, keeping its folders (N_concept subsets
    stay subsets). The archive is checked whole first (paths, links, sizes, each image opened from a
    staging folder); refused archives change nothing."""
    dataset = Path(dataset)
    name = shown_name or Path(zip_path).name
    _writable(dataset)
    try:
        archive = zipfile.ZipFile(zip_path)
    except (zipfile.BadZipFile, OSError) as e:
        raise LibraryError(f"{name}: not a readable .zip ({e}); nothing was added") from None
    with archive, tempfile.TemporaryDirectory(dir=dataset / WORKBENCH_DIR if (dataset / WORKBENCH_DIR).is_dir()
                                              else dataset, prefix=".unzip-") as staging:
        members = _zip_members(archive, name)
        placed: list[tuple[Path, str]] = []
        for m in members:
            rel = Path(m.filename.replace("\\", "/"))
            if any(part.startswith(".") or part == "__MACOSX" for part in rel.parts):
                continue
            suffix = rel.suffix.lower()
            if not _media(suffix) and suffix not in CAPTION_EXTENSIONS:
                continue   # (a zipped `<name>.frames/` folder's frames are images: they unpack as they are)
            target = Path(staging) / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            try:   # zipfile reads at most the declared size and checks the CRC: a lying header fails here
                with archive.open(m) as src, open(target, "wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
            except (zipfile.BadZipFile, OSError, EOFError) as e:
                raise LibraryError(f"{name}: member '{m.filename}' is damaged ({e}); nothing was added") from None
            if suffix in IMAGE_EXTENSIONS:
                _check_image(target, f"{name}: {m.filename}", max_pixels)
            elif suffix in VIDEO_EXTENSIONS:
                _check_clip(target, f"{name}: {m.filename}")
            placed.append((target, rel.as_posix()))
        added = []
        taken: set[str] = set()
        renamed: dict[str, Path] = {}
        for target, rel in sorted(placed, key=lambda t: Path(t[1]).suffix.lower() in CAPTION_EXTENSIONS):
            destination_dir = dataset / Path(rel).parent
            destination_dir.mkdir(parents=True, exist_ok=True)
            stem_key = str(Path(rel).with_suffix(""))
            if Path(rel).suffix.lower() in CAPTION_EXTENSIONS and stem_key in renamed:
                final = renamed[stem_key].with_suffix(Path(rel).suffix)
            else:
                final = _free_name(destination_dir, Path(rel).name, taken)
            shutil.move(str(target), final)
            if _media(Path(rel).suffix.lower()):
                renamed[stem_key] = final
                added.append(final)
        return added


def import_folder(source: Path, dataset: Path, max_pixels: int = DEFAULT_MAX_PIXELS) -> list[Path]:
    """Copy a folder's images, clips and captions (its sub-folders too) into the dataset; the source is
    never changed. Unreadable files are copied as they are (the checks flag them)."""
    source, dataset = Path(source), Path(dataset)
    if not source.is_dir():
        raise LibraryError(f"{source}: no such folder")
    real_src, real_dst = Path(os.path.realpath(source)), Path(os.path.realpath(dataset))
    if real_src == real_dst or real_dst.is_relative_to(real_src) or real_src.is_relative_to(real_dst):
        raise LibraryError(f"{source}: the folder and the dataset overlap; choose another folder")
    _writable(dataset)
    added = []
    taken: set[str] = set()
    for image in [*list_images(source), *list_clips(source)]:   # clips: files and `<name>.frames` folders
        rel = image.relative_to(source)
        (dataset / rel.parent).mkdir(parents=True, exist_ok=True)
        target = _free_name(dataset / rel.parent, rel.name, taken)
        if image.is_dir():
            shutil.copytree(image, target)
        else:
            shutil.copy2(image, target)
        added.append(target)
        for ext in CAPTION_EXTENSIONS:
            if image.with_suffix(ext).is_file():
                shutil.copy2(image.with_suffix(ext), target.with_suffix(ext))
    return added


def subsets(dataset: Path) -> list[tuple[str, int, str]]:
    """(folder name, repeats, concept) of the dataset's kohya `N_concept` sub-folders."""
    out = []
    for child in sorted(p for p in Path(dataset).iterdir() if p.is_dir() and not p.name.startswith(".")):
        match = CONCEPT_DIR.match(child.name)
        if match:
            out.append((child.name, int(match.group(1)), match.group(2)))
    return out


def make_subset(dataset: Path, concept: str, repeats: int) -> Path:
    concept = check_name(concept, "concept")
    if repeats < 1:
        raise LibraryError(f"repeats {repeats}: must be at least 1")
    if any(c == concept for _, _, c in subsets(dataset)):
        raise LibraryError(f"subset '{concept}' already exists in {Path(dataset).name}")
    folder = Path(dataset) / f"{repeats}_{concept}"
    folder.mkdir()
    return folder


def set_repeats(dataset: Path, subset_name: str, repeats: int) -> Path:
    """Rename `N_concept` to `repeats_concept` (kohya reads repeats from the folder's name)."""
    match = CONCEPT_DIR.match(subset_name)
    folder = Path(dataset) / subset_name
    if not match or not folder.is_dir():
        raise LibraryError(f"{subset_name}: not a subset (N_concept folder) of {Path(dataset).name}")
    if repeats < 1:
        raise LibraryError(f"repeats {repeats}: must be at least 1")
    target = Path(dataset) / f"{repeats}_{match.group(2)}"
    if target != folder:
        if target.exists():
            raise LibraryError(f"{target.name} already exists")
        folder.rename(target)
    return target


def delete_dataset(folder: Path) -> None:
    """Remove a dataset the studio created; refuses (changing nothing) any other folder, and one
    holding files that are neither images, clips, captions nor the workbench's own."""
    folder = Path(folder)
    if not made_here(folder):
        raise LibraryError(f"{folder.name}: not created by the studio (no {WORKBENCH_DIR}/{MARKER}); "
                           f"delete it yourself if you mean to")
    foreign = []
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = [d for d in dirnames if not (Path(dirpath) == folder and d == WORKBENCH_DIR)]
        for f in filenames:
            if not _media(Path(f).suffix.lower()) and Path(f).suffix.lower() not in CAPTION_EXTENSIONS:
                foreign.append(os.path.relpath(os.path.join(dirpath, f), folder))
    if foreign:
        raise LibraryError(f"{folder.name}: holds files the studio did not bring in ({', '.join(sorted(foreign)[:3])}"
                           f"{' …' if len(foreign) > 3 else ''}); nothing was deleted")
    shutil.rmtree(folder)


EXCLUDED_DIR = "excluded"


def exclude(dataset: Path, image_rel: str) -> Path:
    """Take one image or clip (and its captions) out of the training set without deleting it: it moves
    to `.workbench/excluded/` (a dot folder the trainer never reads); `restore` brings it back."""
    dataset = Path(dataset)
    source = dataset / image_rel
    if not (source.is_file() or is_clip(source)) or not within(source, [dataset]) \
            or WORKBENCH_DIR in Path(image_rel).parts:
        raise LibraryError(f"{image_rel}: not an image of {dataset.name}")
    target = dataset / WORKBENCH_DIR / EXCLUDED_DIR / image_rel
    if target.exists():
        raise LibraryError(f"{image_rel}: an excluded image of that name exists; restore it first")
    target.parent.mkdir(parents=True, exist_ok=True)
    for ext in CAPTION_EXTENSIONS:
        if source.with_suffix(ext).is_file():
            os.replace(source.with_suffix(ext), target.with_suffix(ext))
    os.replace(source, target)
    return target


def excluded(dataset: Path) -> list[str]:
    """The excluded images and clips (a `<name>.frames` folder is one), as paths inside the dataset."""
    root = Path(dataset) / WORKBENCH_DIR / EXCLUDED_DIR
    if not root.is_dir():
        return []
    found = [*list_images(root), *list_clips(root)]   # the walks: a sequence's frames are not images
    return sorted(p.relative_to(root).as_posix() for p in found)


def restore(dataset: Path, image_rel: str) -> Path:
    dataset = Path(dataset)
    source = dataset / WORKBENCH_DIR / EXCLUDED_DIR / image_rel
    target = dataset / image_rel
    if not (source.is_file() or is_clip(source)) or ".." in Path(image_rel).parts:
        raise LibraryError(f"{image_rel}: not an excluded image of {dataset.name}")
    if target.exists():
        raise LibraryError(f"{image_rel}: a file of that name is back in the dataset; rename it first")
    target.parent.mkdir(parents=True, exist_ok=True)
    for ext in CAPTION_EXTENSIONS:
        if source.with_suffix(ext).is_file() and not target.with_suffix(ext).exists():
            os.replace(source.with_suffix(ext), target.with_suffix(ext))
    os.replace(source, target)
    return target
