"""The README documents what the code does: its config reference is the schema's."""
from pathlib import Path

from trainer_backend.config.reference import BEGIN, END, config_reference

ROOT = Path(__file__).resolve().parent.parent


def test_config_reference_doc_is_current():
    text = (ROOT / "docs" / "config.md").read_text(encoding="utf-8")
    start, end = text.index(BEGIN), text.index(END) + len(END)
    assert text[start:end] == config_reference(), \
        "docs/config.md is stale: run `python -m trainer_backend config-reference --write docs/config.md`"


def test_readme_is_short_and_links_every_doc():
    """A user's page (issue 29): at most 200 lines, the details in docs/, each doc reachable from it."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 200, "README.md over 200 lines: move the detail to docs/"
    assert BEGIN not in text, "the generated config reference lives in docs/config.md"
    unlinked = [p.name for p in (ROOT / "docs").glob("*.md") if f"(docs/{p.name})" not in text]
    assert not unlinked, f"README.md links no: {unlinked}"


def test_writing_the_reference_into_the_readme_is_refused(tmp_path):
    """The old habit `config-reference --write README.md` must not append the reference there again."""
    import subprocess
    import sys
    readme = tmp_path / "README.md"
    readme.write_text("# Hello\n", encoding="utf-8")
    done = subprocess.run([sys.executable, "-m", "trainer_backend", "config-reference", "--write", str(readme)],
                          capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 2 and "docs/config.md" in done.stderr
    assert readme.read_text(encoding="utf-8") == "# Hello\n"


def test_readme_gives_the_two_commands():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "./setup.sh && .venv/bin/python app.py" in text
    assert "./setup.sh && .venv/bin/python -m pytest" in text
    ci = (ROOT / ".ci" / "run").read_text()
    assert "./setup.sh" in ci and ".venv/bin/python -m pytest" in ci


def test_checkpoints_doc_lists_the_refused_resume_changes_from_the_schema():
    from trainer_backend.config.reference import RESUME_BEGIN, RESUME_END, resume_reference
    text = (ROOT / "docs" / "checkpoints.md").read_text(encoding="utf-8")
    start, end = text.index(RESUME_BEGIN), text.index(RESUME_END) + len(RESUME_END)
    assert text[start:end] == resume_reference(), \
        "docs/checkpoints.md is stale: run `python -m trainer_backend config-reference --write docs/checkpoints.md`"
    assert "`network.dora`" in text and "`network.lokr_factor`" in text  # refused since issue 11
