"""The README documents what the code does: its config reference is the schema's."""
from pathlib import Path

from trainer_backend.config.reference import BEGIN, END, config_reference

ROOT = Path(__file__).resolve().parent.parent


def test_readme_config_reference_is_current():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    start, end = text.index(BEGIN), text.index(END) + len(END)
    assert text[start:end] == config_reference(), \
        "README config reference is stale: run `python -m trainer_backend config-reference --write README.md`"


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
