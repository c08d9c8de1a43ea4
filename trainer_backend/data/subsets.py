"""Resolving [dataset] + [[dataset.subsets]] into concrete groups of image files.

A *subset* is one configured folder. A *group* is what training counts: one set of images with
one repeat count and one caption fallback — a flat folder is one group, each kohya-style
`N_concept` subfolder is another.
"""
from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

from ..config import ConfigError, Dataset
from .captions import CaptionAugment
from .images import is_image_name

CONCEPT_DIR = re.compile(r"^(\d+)_(.+)$")


MAX_FOLDER_REPEATS = 10000   # the bound of dataset.repeats / subsets[].repeats


def _folder_repeats(spec, folder: Path, match: re.Match) -> int:
    """N of an N_concept folder name, bounded like the repeats options."""
    n = int(match.group(1))
    if n > MAX_FOLDER_REPEATS:
        raise ConfigError(f"{spec.key}: folder {folder.name} asks for {match.group(1)} repeats; at most "
                          f"{MAX_FOLDER_REPEATS:,} (rename it, e.g. 10_{match.group(2)})")
    return n


@dataclass(frozen=True)
class SubsetSpec:
    """One configured folder with every option resolved (no "inherit" left)."""
    key: str                    # config key for messages: "dataset.path", "dataset.subsets[1].path"
    root: Path
    source: str                 # folders | metadata
    metadata_path: str
    repeats: int                # 0: take it from an N_concept folder name, else default_repeats
    default_repeats: int
    caption_extension: str
    class_tokens: str
    flip: bool
    center_crop: bool
    captions: CaptionAugment
    is_class: bool = False
    class_prompt: str = ""
    mask_path: str = ""         # loss.masked: mask folder ("" = the images' alpha channel; data/masks.py)
    control_root: Path | None = None   # the folder of paired control images (data/pairs.py); None = unpaired

    @property
    def control_key(self) -> str:
        """The config key of this folder's control images: dataset.control_path, dataset.subsets[i].control_path."""
        return self.key.rpartition(".")[0] + ".control_path"


@dataclass
class Group:
    """Images that share a repeat count and caption fallback."""
    name: str
    spec: SubsetSpec
    repeats: int
    class_tokens: str
    files: list[Path] = field(default_factory=list)

    @property
    def folder(self) -> Path:
        """The folder this group's images are in (the subset root, or its N_concept subfolder)."""
        return self.spec.root if self.name == self.spec.root.name else self.spec.root / self.name


def _pick(value, inherit, fallback):
    return fallback if value == inherit else value


def resolve_subsets(ds: Dataset) -> list[SubsetSpec]:
    """dataset.path (when set) followed by each [[dataset.subsets]] entry, options inherited."""
    base_aug = CaptionAugment(dropout=ds.caption_dropout, shuffle=ds.shuffle_tags, shuffle_p=ds.shuffle_tags_p,
                              keep_tokens=ds.keep_tokens, tag_dropout=ds.tag_dropout,
                              separator=ds.caption_separator)
    specs = []
    if ds.path:
        specs.append(SubsetSpec("dataset.path", Path(ds.path).expanduser(), ds.source, ds.metadata_path, 0,
                                ds.repeats, ds.caption_extension, ds.class_tokens, ds.flip, ds.center_crop,
                                base_aug, mask_path=ds.mask_path, control_root=_control_root(ds.control_path)))
    for i, sub in enumerate(ds.subsets):
        aug = CaptionAugment(dropout=_pick(sub.caption_dropout, -1.0, ds.caption_dropout),
                             shuffle=_pick(sub.shuffle_tags, "inherit", ds.shuffle_tags), shuffle_p=ds.shuffle_tags_p,
                             keep_tokens=_pick(sub.keep_tokens, -1, ds.keep_tokens),
                             tag_dropout=_pick(sub.tag_dropout, -1.0, ds.tag_dropout),
                             separator=ds.caption_separator)
        specs.append(SubsetSpec(
            f"dataset.subsets[{i}].path", Path(sub.path).expanduser(), _pick(sub.source, "inherit", ds.source),
            sub.metadata_path, sub.repeats, ds.repeats, sub.caption_extension or ds.caption_extension,
            sub.class_tokens, _pick(sub.flip, "inherit", ds.flip), _pick(sub.center_crop, "inherit", ds.center_crop),
            aug, mask_path=sub.mask_path or ds.mask_path, control_root=_control_root(sub.control_path)))
    if not specs:
        raise ConfigError("dataset.path: no dataset given (set dataset.path or add [[dataset.subsets]])")
    return specs


def _control_root(value: str) -> Path | None:
    return Path(value).expanduser() if value else None


def class_spec(ds: Dataset) -> SubsetSpec | None:
    """Class (regularization) images: a folder scanned like a dataset folder (flat or N_concept),
    captioned with the class prompt; crop and flip follow [dataset], captions are never shuffled."""
    if not ds.class_path:
        return None
    aug = CaptionAugment(separator=ds.caption_separator)
    return SubsetSpec("dataset.class_path", Path(ds.class_path).expanduser(), "folders", "", 0, 1,
                      ds.caption_extension, ds.class_prompt, ds.flip, ds.center_crop, aug, is_class=True,
                      class_prompt=ds.class_prompt)


def check_root(spec: SubsetSpec) -> None:
    """A missing or non-folder root stops the run with a message naming the key."""
    if not spec.root.exists():
        raise ConfigError(f"{spec.key}: folder not found: {spec.root}")
    if not spec.root.is_dir():
        raise ConfigError(f"{spec.key}: not a folder: {spec.root}")
    if not os.access(spec.root, os.R_OK | os.X_OK):
        raise ConfigError(f"{spec.key}: folder is not readable: {spec.root}")


def walk_images(root: Path, problems: list[tuple[Path, str]]) -> list[Path]:
    """Image files under root (recursively, sorted), following symlinks but never around a loop.
    Loops and unreadable folders are reported in `problems` and skipped."""
    out: list[Path] = []
    seen: set[tuple[int, int]] = set()

    def visit(folder: Path) -> None:
        try:
            st = folder.stat()
        except OSError as e:
            problems.append((folder, f"unreadable folder ({e.strerror or e})"))
            return
        ident = (st.st_dev, st.st_ino)
        if ident in seen:
            problems.append((folder, "symlink loop (folder already visited)"))
            return
        seen.add(ident)
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError as e:
            problems.append((folder, f"unreadable folder ({e.strerror or e})"))
            return
        for entry in entries:
            path = Path(entry.path)
            if entry.name.startswith("."):
                continue
            try:
                is_dir = entry.is_dir(follow_symlinks=True)
            except OSError as e:
                problems.append((path, f"unreadable ({e.strerror or e})"))
                continue
            if is_dir:
                if entry.name.lower().endswith(".frames"):  # an image-sequence clip (data/video.py), not images
                    continue
                visit(path)
            elif is_image_name(path):
                try:  # a FIFO or device would block a read forever; a dangling link is reported when read
                    regular = stat.S_ISREG(os.stat(path).st_mode)
                except OSError:
                    regular = True
                if regular:
                    out.append(path)
                else:
                    problems.append((path, "not a regular file (a FIFO, socket or device): skipped"))

    visit(root)
    return out


def folder_groups(spec: SubsetSpec, problems: list[tuple[Path, str]], notes: list[str]) -> list[Group]:
    """kohya layout: the root's own images form one group; every `N_concept` subfolder is a group
    with N repeats and "concept" as class tokens. Without N_concept subfolders the whole tree is one
    flat group. A root that is itself named N_concept takes its repeats from the name."""
    root = spec.root
    own = CONCEPT_DIR.match(root.name)
    if own and spec.repeats == 0:
        return [Group(root.name, spec, _folder_repeats(spec, root, own), spec.class_tokens or own.group(2),
                      walk_images(root, problems))]
    repeats = spec.repeats or spec.default_repeats
    try:
        children = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    except OSError as e:
        raise ConfigError(f"{spec.key}: folder is not readable: {root} ({e.strerror or e})") from None
    concept_dirs = [p for p in children if CONCEPT_DIR.match(p.name)]
    if not concept_dirs:
        return [Group(root.name or str(root), spec, repeats, spec.class_tokens, walk_images(root, problems))]
    groups = []
    flat = sorted(p for p in root.iterdir() if p.is_file() and is_image_name(p))
    if flat:
        groups.append(Group(root.name, spec, repeats, spec.class_tokens, flat))
    for child in children:
        match = CONCEPT_DIR.match(child.name)
        if not match:
            notes.append(f"{child}: folder ignored (not named N_concept, e.g. 10_{child.name})")
            continue
        n = _folder_repeats(spec, child, match)
        if n == 0:
            notes.append(f"{child}: folder ignored (0 repeats)")
            continue
        groups.append(Group(child.name, spec, spec.repeats or n, spec.class_tokens or match.group(2),
                            walk_images(child, problems)))
    return groups
