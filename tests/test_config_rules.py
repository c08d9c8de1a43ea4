"""Cross-field rules in one module (trainer_backend/config/rules.py): every problem at once, each
naming its key, from `validate`, the trainer and the studio's form alike."""
import subprocess
import sys

import pytest

from conftest import ROOT
from trainer_backend.config import ConfigError, TrainConfig, load_config, rules

BROKEN = ["network.dora=true", "network.type=loha", "optimizer.name=prodigy", "loss.timestep_min=900",
          "loss.timestep_max=100", "hardware.machine_rank=2"]
WANT_KEYS = {"network.dora", "loss.timestep_min", "hardware.machine_rank"}


def prodigy_installed() -> bool:
    import importlib.util
    return importlib.util.find_spec("prodigyopt") is not None


def test_every_problem_is_reported_each_naming_its_key():
    found = rules.problems(load_config(None, BROKEN))
    keys = {message.split(":", 1)[0] for message in found}
    assert WANT_KEYS <= keys
    assert ("optimizer.name" in keys) == (not prodigy_installed())
    assert rules.problems(TrainConfig()) == []
    with pytest.raises(ConfigError, match="^loss.timestep_min"):
        rules.check(load_config(None, BROKEN))


def test_validate_refuses_what_train_would_refuse_and_lists_everything(tmp_path):
    args = [x for o in BROKEN for x in ("--set", o)]
    out = subprocess.run([sys.executable, "-m", "trainer_backend", "validate", *args], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 2
    lines = [line for line in out.stderr.splitlines() if line.startswith("error: ")]
    assert {line[len("error: "):].split(":", 1)[0] for line in lines} >= WANT_KEYS
    if not prodigy_installed():  # the optimizer package train() would fail on, caught before any model loads
        assert any("optimizer.name: 'prodigy' needs the 'prodigyopt' package" in line for line in lines)


def test_the_form_shows_every_problem_under_its_own_field():
    from gui.schema_form import config_to_values, form_fields, form_problems
    from gui.widgets import error_updates
    fields = form_fields()
    values = config_to_values(fields, load_config(None, BROKEN))
    cfg, errors = form_problems(fields, values)
    assert cfg is not None and len(errors) >= len(WANT_KEYS)
    updates = error_updates(fields, errors)
    shown = {f.dotted: u["value"] for f, u in zip(fields, updates) if u.get("visible")}
    assert WANT_KEYS <= set(shown)
    assert "DoRA is a LoRA option" in shown["network.dora"]
    assert "must be 0 on a single machine" in shown["hardware.machine_rank"]
