"""The README's config reference, generated from the schema (a test keeps them in sync:
run `python -m trainer_backend config-reference --write README.md` after adding an option)."""
from __future__ import annotations

import re
from pathlib import Path

from . import all_fields, sections
from .applicability import describe

BEGIN, END = "<!-- config-reference:begin -->", "<!-- config-reference:end -->"


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


def write_into(readme: Path) -> None:
    text = readme.read_text(encoding="utf-8")
    block = config_reference()
    if BEGIN in text:
        text = re.sub(re.escape(BEGIN) + r".*?" + re.escape(END), lambda _: block, text, flags=re.S)
    else:
        text += "\n" + block + "\n"
    readme.write_text(text, encoding="utf-8")
