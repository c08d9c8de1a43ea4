"""Caption edits: one caption at a time, or one operation over many (trigger word, find and
replace, remove or rename a tag), planned first (a preview and a count), then written through
the journal (journal.py) so every edit can be undone.

The operations are pure functions of a caption (tested with hypothesis); `plan_edit` reads the
files, `apply_plan` writes the changed ones in one journal entry, refusing when a file changed
since it was planned (another tab, another program).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ..data.captions import join_tags, split_tags
from .journal import JournalError, apply
from .metadata_captions import metadata_index, rewrite_metadata_captions, save_metadata_caption


class EditError(ValueError):
    """An edit that cannot be made (bad regex, unreadable caption…); one line; nothing changed."""


@dataclass(frozen=True)
class Operation:
    kind: str            # prepend | append | replace | remove_tag | rename_tag
    text: str = ""       # prepend/append text, replace's old, the tag to remove or rename
    new: str = ""        # replace's new text, the tag's new name
    regex: bool = False
    separator: str = ","

    def label(self) -> str:
        return {"prepend": f"prepend '{self.text}'", "append": f"append '{self.text}'",
                "replace": f"replace '{self.text}' with '{self.new}'" + (" (regex)" if self.regex else ""),
                "remove_tag": f"remove tag '{self.text}'",
                "rename_tag": f"rename tag '{self.text}' to '{self.new}'"}[self.kind]


def check_operation(op: Operation) -> None:
    if op.kind not in ("prepend", "append", "replace", "remove_tag", "rename_tag"):
        raise EditError(f"unknown edit '{op.kind}'")
    if not op.text.strip() and op.kind != "replace":
        raise EditError(f"{op.kind}: the text is empty")
    if op.kind == "replace":
        if not op.text:
            raise EditError("replace: the text to find is empty")
        if op.regex:
            try:
                re.compile(op.text)
            except re.error as e:
                raise EditError(f"replace: not a valid regular expression: {e}") from None


def edit_caption(caption: str | None, op: Operation) -> str | None:
    """The caption after the operation (None stays None unless a trigger word is added)."""
    sep = op.separator
    if op.kind in ("prepend", "append"):
        word = op.text.strip()
        tags = split_tags(caption or "", sep)
        if word in tags:
            return caption
        return join_tags([word, *tags] if op.kind == "prepend" else [*tags, word], sep)
    if caption is None:
        return None
    if op.kind == "replace":
        return re.sub(op.text, op.new, caption) if op.regex else caption.replace(op.text, op.new)
    tags = split_tags(caption, sep)
    if op.text.strip() not in tags:
        return caption
    if op.kind == "remove_tag":
        return join_tags([t for t in tags if t != op.text.strip()], sep)
    renamed: list[str] = []
    for t in tags:
        t = op.new.strip() if t == op.text.strip() else t
        if t and t not in renamed:
            renamed.append(t)
    return join_tags(renamed, sep)


def caption_path(folder: Path, image_rel: str, extension: str) -> Path:
    return (Path(folder) / image_rel).with_suffix(extension)


def read_caption_text(path: Path) -> str | None:
    """The caption file's text as it is (None: no file). Raises EditError for a file that is not UTF-8
    (editing it would change characters the user never touched) or cannot be read."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise EditError(f"{path.name}: cannot be read ({e.strerror or e})") from None
    try:
        return raw.removeprefix(b"\xef\xbb\xbf").decode("utf-8")
    except UnicodeDecodeError:
        raise EditError(f"{path.name}: not UTF-8 text (another encoding); save it as UTF-8 first; "
                        f"nothing was changed") from None


@dataclass(frozen=True)
class Change:
    path: Path          # the caption file, or the metadata JSON file holding the changed records
    before: str | None  # the file's whole text (None: no file)
    after: str | None
    # what a person reads in the preview: (image or file name, caption before, caption after) per caption
    shown: tuple[tuple[str, str | None, str], ...] = ()

    def captions(self) -> tuple[tuple[str, str | None, str], ...]:
        return self.shown or ((self.path.name, self.before, self.after or ""),)


def plan_edit(folder: Path, images: list[str], op: Operation, extension: str = ".txt") -> list[Change]:
    """The files the operation would change (unchanged ones left out), in image order. An image's
    caption is its caption file when it has one, else its metadata JSON record (the per-image editor's
    rule); each metadata file becomes one Change holding all its changed records."""
    check_operation(op)
    in_metadata = metadata_index(folder)
    out: list[Change] = []
    by_json: dict[Path, dict[int | None, tuple[str, str, str]]] = {}
    for rel in images:
        path = caption_path(folder, rel, extension)
        if rel in in_metadata and not path.exists():
            json_path, position, caption = in_metadata[rel]
            after = edit_caption(caption, op)
            if after is not None and after != caption:
                by_json.setdefault(json_path, {})[position] = (Path(rel).name, caption, after)
            continue
        before = read_caption_text(path)
        after = edit_caption(before if before is None else before.strip(), op)
        if after is not None and after != (before or "").strip():
            out.append(Change(path, before, after))
    for json_path, records in by_json.items():
        try:
            before, after = rewrite_metadata_captions(json_path, {pos: new for pos, (_, _, new) in records.items()})
        except (OSError, ValueError) as e:
            raise EditError(f"{json_path.name}: cannot be rewritten ({e}); nothing was changed") from None
        out.append(Change(json_path, before, after, tuple(records.values())))
    return out


def preview(changes: list[Change], first: int = 5) -> str:
    """The count of captions and the first changes, before -> after, one per line."""
    captions = [c for change in changes for c in change.captions()]
    n = len(captions)
    in_metadata = sum(len(change.shown) for change in changes)
    if in_metadata:
        head = f"{n} caption{'s' if n != 1 else ''} would change ({in_metadata} in metadata JSON)"
    else:
        head = f"{n} caption file{'s' if n != 1 else ''} would change"
    lines = [head]
    for name, before, after in captions[:first]:
        lines.append(f"{name}: {before if before is not None else '(none)'!s} -> {after}")
    if n > first:
        lines.append(f"… and {n - first} more")
    return "\n".join(lines)


def apply_plan(folder: Path, changes: list[Change], label: str) -> str:
    """Write the planned changes in one journal entry; '' when there are none."""
    try:
        return apply(folder, {c.path: c.after for c in changes}, label, expected={c.path: c.before for c in changes})
    except JournalError as e:
        raise EditError(str(e)) from None


def save_caption(folder: Path, image_rel: str, text: str, loaded: str | None, extension: str = ".txt") -> str:
    """Save one image's caption (the per-image editor): journaled, refused when the file no longer
    holds `loaded` (what the editor showed). Returns the journal entry id ('' when nothing changed)."""
    path = caption_path(folder, image_rel, extension)
    if not path.exists():
        in_metadata = metadata_index(folder)
        if image_rel in in_metadata:
            if in_metadata[image_rel][2] == text:
                return ""
            try:
                return save_metadata_caption(folder, image_rel, text, loaded)
            except JournalError as e:
                raise EditError(str(e)) from None
    if read_caption_text(path) == text:
        return ""
    try:
        return apply(folder, {path: text}, f"caption {Path(image_rel).name}", expected={path: loaded})
    except JournalError as e:
        raise EditError(str(e)) from None
