"""Caption files and per-sample caption randomness (pure apart from `read_caption`)."""
from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from .caption_json import JSON_EXTENSION, CaptionSchemaError, parse_caption


@dataclass(frozen=True)
class CaptionRead:
    text: str | None          # None: no caption file
    problem: str = ""         # "" or why the caption is suspicious (empty, not UTF-8, unreadable)


def read_caption(image: Path, extension: str) -> CaptionRead:
    """The same-named caption file of an image (`a.png` -> `a.txt`). Non-UTF-8 bytes are decoded
    with replacement characters and reported; an empty file is reported as empty."""
    path = image.with_suffix(extension)
    try:
        if path.exists() and not path.is_file():  # a FIFO named *.txt would block the read forever
            return CaptionRead(None, f"caption {path.name} is not a regular file (skipped)")
        raw = path.read_bytes()
    except FileNotFoundError:
        return CaptionRead(None)
    except OSError as e:
        return CaptionRead(None, f"caption {path.name} unreadable ({e.strerror or e})")
    problem = ""
    if raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = raw.decode("utf-8", errors="replace")
        problem = f"caption {path.name} is not UTF-8 (decoded with replacement characters)"
    if extension.lower() == JSON_EXTENSION and text.strip():  # a structured caption (data/caption_json.py)
        try:
            return CaptionRead(parse_caption(text), problem)
        except CaptionSchemaError as e:
            return CaptionRead(None, f"caption {path.name}: {e} (skipped)")
    text = " ".join(text.split())  # one line, single spaces: newlines in captions are never meaningful
    if not text:
        return CaptionRead("", problem or f"caption {path.name} is empty")
    return CaptionRead(text, problem)


def split_tags(caption: str, separator: str) -> list[str]:
    return [t.strip() for t in caption.split(separator) if t.strip()]


def join_tags(tags: list[str], separator: str) -> str:
    # a "," separator reads best as ", " in the caption the text encoder sees
    glue = separator + " " if separator.strip() == separator and not separator.endswith(" ") else separator
    return glue.join(tags)


@dataclass(frozen=True)
class CaptionAugment:
    """Per-subset caption options; all randomness comes from the rng passed in."""
    dropout: float = 0.0
    shuffle: bool = False
    shuffle_p: float = 1.0
    keep_tokens: int = 0
    tag_dropout: float = 0.0
    separator: str = ","

    @property
    def is_static(self) -> bool:
        """True when a sample's caption is the same every epoch (text-encoder outputs cacheable).
        Caption dropout only swaps in the empty caption, which is cached too."""
        return not (self.shuffle and self.shuffle_p > 0) and self.tag_dropout == 0


def augment_caption(caption: str, tags: list[str], aug: CaptionAugment, rng: random.Random,
                    separator: str | None = None) -> str:
    """The caption one sample trains with: caption dropout, then tag dropout and shuffle of the
    tags after the first `keep_tokens`. Draws from the rng in a fixed order (reproducible); returns
    `caption` untouched when no tag operation is configured."""
    drop_caption = rng.random() < aug.dropout if aug.dropout > 0 else False
    head, tail = tags[:aug.keep_tokens], tags[aug.keep_tokens:]
    changed = False
    if aug.tag_dropout > 0:
        tail = [t for t in tail if rng.random() >= aug.tag_dropout]
        changed = True
    if aug.shuffle and aug.shuffle_p > 0 and rng.random() < aug.shuffle_p:
        tail = tail[:]
        rng.shuffle(tail)
        changed = True
    if drop_caption:
        return ""
    if not changed:
        return caption
    return join_tags(head + tail, separator if separator is not None else aug.separator)
