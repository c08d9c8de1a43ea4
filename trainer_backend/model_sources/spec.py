"""`org/name[@revision]` (a hub repo) and `org/name/path/file.safetensors[@revision]` (one file of a
repo) in a model field, told apart from local paths (pure; an existing local path always wins, which the
caller checks)."""
from __future__ import annotations

import re
from dataclasses import dataclass

# the hub's own rules for a repo id's parts: letters, digits, `-`, `_`, `.`; no `--` or `..`; <= 96 chars
_PART = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9_])?$")
_REVISION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,127}$")
# weight files a path can name inside a repo; a two-part value ending like this is a missing local file
FILE_SUFFIXES = (".safetensors", ".sft", ".gguf")
NOT_HUB_PREFIXES = ("builtin:", "/", "./", "../", "~", "\\")


@dataclass(frozen=True)
class HubSpec:
    repo_id: str                 # org/name
    revision: str = "main"       # a branch, tag or commit
    filename: str = ""           # one file of the repo ("" = the repo's files the model needs)

    def __str__(self) -> str:
        text = self.repo_id + (f"/{self.filename}" if self.filename else "")
        return text + (f"@{self.revision}" if self.revision != "main" else "")


def _valid_part(part: str) -> bool:
    return bool(_PART.match(part)) and "--" not in part and ".." not in part


def parse_hub_spec(value: str) -> HubSpec | None:
    """The HubSpec a model field's value names, or None when it is not a hub id (a local path,
    `builtin:`, empty). Existence of a local path is the caller's test: `stabilityai/foo` may be both."""
    text = (value or "").strip()
    if not text or text.startswith(NOT_HUB_PREFIXES) or ":" in text or "\\" in text:
        return None
    body, at, revision = text.partition("@")
    if at and not _REVISION.match(revision):
        return None
    parts = body.split("/")
    if len(parts) < 2 or not all(_valid_part(p) for p in parts):
        return None
    if len(parts) == 2:
        if parts[1].lower().endswith(FILE_SUFFIXES):
            return None
        return HubSpec(body, revision or "main")
    if not parts[-1].lower().endswith(FILE_SUFFIXES):
        return None
    return HubSpec("/".join(parts[:2]), revision or "main", "/".join(parts[2:]))
