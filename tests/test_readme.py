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
