"""Cross-field rules in one module (trainer_backend/config/rules.py): every problem at once, each
naming its key, from `validate`, the trainer and the studio's form alike."""
import ast
import importlib.util
import subprocess
import sys

import pytest

from conftest import ROOT
from trainer_backend.config import ConfigError, TrainConfig, load_config, rules
from trainer_backend.config.base import Problem

BROKEN = ["network.dora=true", "network.type=loha", "optimizer.name=prodigy", "loss.timestep_min=900",
          "loss.timestep_max=100", "hardware.machine_rank=2", "hardware.num_machines=2", "hardware.gpu_ids='0,0'",
          "validation.fraction=0.1", "dataset.validation_every_nth=4", "checkpoints.export_at='epochs'",
          'samples.prompts="a dog --w wide"']
WANT_KEYS = {"network.dora", "loss.timestep_min", "hardware.machine_rank", "hardware.main_process_ip",
             "hardware.gpu_ids", "validation.fraction", "checkpoints.export_at", "samples.prompts"}


def prodigy_installed() -> bool:
    return importlib.util.find_spec("prodigyopt") is not None


def test_every_problem_is_reported_each_naming_its_key():
    found = rules.problems(load_config(None, BROKEN))
    assert all(isinstance(p, Problem) for p in found)
    keys = {p.key for p in found}
    assert WANT_KEYS <= keys
    assert ("optimizer.name" in keys) == (not prodigy_installed())
    assert all(str(p).startswith(p.key + ": ") for p in found)  # the one-line form names the key
    assert len(found) == len(set(found))
    assert rules.problems(TrainConfig()) == []
    with pytest.raises(ConfigError, match="^loss.timestep_min"):
        rules.check(load_config(None, BROKEN))


def test_the_old_entry_points_keep_their_scope():
    """validate_hardware and check_precision_options report only their own groups (thin wrappers)."""
    from trainer_backend.launch.argv import validate_hardware
    from trainer_backend.training.full_half_precision import check_precision_options
    cfg = load_config(None, ["network.type=vae", "vae.precision=fp16", "hardware.machine_rank=1"])
    with pytest.raises(ConfigError, match="^hardware.machine_rank"):
        validate_hardware(cfg)
    with pytest.raises(ConfigError, match="^vae.precision: fp16 is refused"):
        check_precision_options(cfg)
    assert {p.key for p in rules.problems(cfg)} >= {"hardware.machine_rank", "vae.precision"}


def test_rules_live_below_config_and_import_no_higher_package():
    """config/rules.py and its helpers import nothing from methods/, training/, launch/ (or torch):
    that is what lets config/checks, the GUI and `validate` run them without an import cycle."""
    for name in ("rules.py", "hardware_rules.py", "sample_prompts.py"):
        tree = ast.parse((ROOT / "trainer_backend" / "config" / name).read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                module = "." * node.level + (node.module or "")
            elif isinstance(node, ast.Import):
                module = node.names[0].name
            else:
                continue
            assert not module.lstrip(".").split(".")[0] in ("torch", "diffusers", "methods", "training", "launch"), \
                f"config/{name} imports {module}"


def test_validate_refuses_what_train_would_refuse_and_lists_everything(tmp_path):
    args = [x for o in BROKEN for x in ("--set", o)] + ["--set", f"model.path={tmp_path / 'missing'}"]
    out = subprocess.run([sys.executable, "-m", "trainer_backend", "validate", *args], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 2
    lines = [line for line in out.stderr.splitlines() if line.startswith("error: ")]
    keys = {line[len("error: "):].split(":", 1)[0] for line in lines}
    assert keys >= WANT_KEYS | {"model.path", "dataset.path"}  # file problems and rules, all at once
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
    assert "must be below hardware.num_machines" in shown["hardware.machine_rank"]


def test_a_field_with_a_problem_is_highlighted_and_the_others_are_not():
    from gui.schema_form import config_to_values, field_visibility, form_fields, form_problems
    from gui.widgets import FormWidgets, error_updates, shown_errors
    fields = form_fields()
    values = config_to_values(fields, load_config(None, BROKEN))
    _, errors = form_problems(fields, values)
    form = FormWidgets(fields=fields, inputs=[], errors=[], tabs=None)
    updates = form.visibility_updates(field_visibility(fields, values), shown_errors(error_updates(fields, errors)))
    classes = {f.dotted: u["elem_classes"] for f, u in zip(fields, updates)}
    # the form checks what Start checks (config/checks.py run_problems): the empty paths too
    assert {k for k, c in classes.items() if "field-invalid" in c} == WANT_KEYS | {"model.path", "dataset.path"} | (
        set() if prodigy_installed() else {"optimizer.name"})
