"""docs/config.md's config reference and docs/checkpoints.md's table of refused resume changes, both
generated from the schema (tests keep them in sync: run `python -m trainer_backend config-reference
--write docs/config.md` and `… --write docs/checkpoints.md` after adding an option)."""
from __future__ import annotations

import re
from pathlib import Path

from . import all_fields, sections
from .applicability import describe

BEGIN, END = "<!-- config-reference:begin -->", "<!-- config-reference:end -->"
REFERENCE_DOC = "docs/config.md"  # relative to the project root
RESUME_BEGIN, RESUME_END = "<!-- resume-safety:begin -->", "<!-- resume-safety:end -->"
# what run/resume.py refuses besides the options' own declarations (it compares more than options)
RESUME_CHECKS = (
    ("the dataset's contents (images added/removed/resized, captions, repeats, paired control images)", "named as `dataset.path`"),
    ("`model.path` (another file/folder name)", "another base model"),
    ("the number of processes", "each rank's data position and RNG state"),
    ("`precision.mixed` to or from fp16", "the gradient scaler's state"),
)


def _bounds(f: dict) -> str:
    if "choices" in f:
        return " \\| ".join(str(c) for c in f["choices"])
    parts = []
    for key, sym in (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<")):
        if key in f:
            parts.append(f"{sym} {f[key]}")
    return ", ".join(parts)


def _default(value) -> str:
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def config_reference() -> str:
    lines = [BEGIN, ""]
    by_section: dict[str, list[dict]] = {}
    for f in all_fields():
        by_section.setdefault(f["section"], []).append(f)
    for name, cls in sections().items():
        section_where = f" *Applies {describe(dict(cls.WHEN))}.*" if cls.WHEN else ""
        lines += [f"#### `[{name}]` — {(cls.__doc__ or '').strip()} (GUI tab: {cls.TAB})", ""]
        lines += [section_where.strip(), ""] if section_where else []
        lines += ["| key | default | allowed | what it does |", "|---|---|---|---|"]
        for f in by_section.get(name, []):
            where = describe({k: v for k, v in f["when"].items() if k not in cls.WHEN})
            help_text = (f["help"] + (f" *Applies {where}.*" if where else "")).replace("|", "\\|")
            lines.append(f"| `{f['key']}` | `{_default(f['default'])}` | {_bounds(f)} | {help_text} |")
        lines.append("")
    lines.append(END)
    return "\n".join(lines)


def resume_reference() -> str:
    """The options a resume refuses to see changed, grouped by why (their `F(resume="unsafe:…")`)."""
    from .base import RESUME_REASONS
    by_reason: dict[str, list[str]] = {}
    bucketing: list[str] = []
    for f in all_fields():
        kind, _, reason = f["resume"].partition(":")
        key = f"`{f['section']}.{f['key']}`"
        if kind == "unsafe":
            by_reason.setdefault(reason, []).append(key)
        elif kind == "unsafe_if_bucketing":
            bucketing.append(key)
    lines = [RESUME_BEGIN, "", "| Refused change | Why |", "|---|---|"]
    lines += [f"| {', '.join(keys)} | {RESUME_REASONS[reason]} |" for reason, keys in by_reason.items()]
    if bucketing:
        lines.append(f"| {', '.join(bucketing)} (with `dataset.bucketing` on) | {RESUME_REASONS['buckets']} |")
    lines += [f"| {what} | {why} |" for what, why in RESUME_CHECKS]
    return "\n".join([*lines, "", RESUME_END])


BLOCKS = ((BEGIN, END, config_reference), (RESUME_BEGIN, RESUME_END, resume_reference))


def write_into(doc: Path) -> None:
    """Regenerate every generated block the file holds. A file with none is refused (ValueError), so
    an old habit (`--write README.md`, where the reference lived before) cannot append it there."""
    text = doc.read_text(encoding="utf-8")
    found = False
    for begin, end, make in BLOCKS:
        if begin in text:
            block = make()
            text = re.sub(re.escape(begin) + r".*?" + re.escape(end), lambda _: block, text, flags=re.S)
            found = True
    if not found:
        raise ValueError(f"{doc} holds no generated block; the config reference lives in {REFERENCE_DOC} "
                         "and the resume table in docs/checkpoints.md")
    doc.write_text(text, encoding="utf-8")
