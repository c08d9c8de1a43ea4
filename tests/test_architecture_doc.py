"""docs/architecture.md is the map: every module of trainer_backend/ and gui/ has its line there,
and every module the map names exists (a moved or new file fails here until the map follows)."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "architecture.md"


def modules() -> set[str]:
    found = set()
    for pkg in ("trainer_backend", "gui"):
        for p in (ROOT / pkg).rglob("*.py"):
            rel = p.relative_to(ROOT / pkg).as_posix()
            if p.name == "__init__.py" and p.read_text(encoding="utf-8").strip() == "":
                continue  # an empty package marker says nothing
            found.add(f"{pkg}/{rel}")
    return found


def mapped() -> set[str]:
    text = DOC.read_text(encoding="utf-8")
    section = None
    out = set()
    for line in text.splitlines():
        if line.startswith("### "):
            section = line[4:].strip()
        m = re.match(r"- `([^`]+\.py)` — ", line)
        if m and section in ("trainer_backend", "gui"):
            name = m.group(1)
            out.add(name if name.startswith(f"{section}/") else f"{section}/{name}")
    return out


def test_every_module_has_a_line_on_the_map():
    missing = sorted(modules() - mapped())
    assert not missing, f"docs/architecture.md has no line for: {missing}"


def test_the_map_names_only_modules_that_exist():
    stale = sorted(mapped() - modules())
    assert not stale, f"docs/architecture.md names modules that do not exist: {stale}"
