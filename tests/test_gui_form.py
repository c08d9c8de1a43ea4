"""The training form is derived from the schema: every field once, in its section's tab, with
the schema's default, choices and help; values convert both ways; validation errors land on
the field they name; and the GUI process never imports torch."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from trainer_backend.config import ConfigError, TrainConfig, all_fields, from_dict, sections, to_dict

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def fields():
    from gui.schema_form import form_fields
    return form_fields()


@pytest.fixture(scope="module")
def app_config(tmp_path_factory):
    """The rendered Blocks config of the real app (what the browser receives)."""
    from gui.shared_state import Settings, Studio
    from gui.studio import build_app
    tmp = tmp_path_factory.mktemp("gui-form")
    studio = Studio.create(Settings(runs_dir=tmp / "runs", presets_dir=tmp / "presets"))
    app = build_app(studio)
    return studio, app.get_config_file()


def test_every_schema_field_once_in_its_sections_tab(fields):
    expected = [(m["section"], m["key"]) for m in all_fields()]
    assert [(f.section, f.key) for f in fields] == expected
    for f in fields:
        assert f.tab == sections()[f.section].TAB


def test_each_field_is_rendered_with_schema_default_choices_and_help(fields, app_config):
    studio, config = app_config
    by_id = {c["props"].get("elem_id"): c for c in config["components"] if c.get("props", {}).get("elem_id")}
    initial = to_dict(studio.initial()[1])
    for f in fields:
        comp = by_id.get(f.elem_id)
        assert comp is not None, f"{f.dotted} has no widget"
        props = comp["props"]
        assert f.help.split(";")[0][:30] in (props.get("info") or ""), f"{f.dotted}: help text missing"
        expected_type = {"bool": "checkbox", "choice": "dropdown", "int": "number", "float": "number"}.get(
            f.type, "textbox")
        assert comp["type"] == expected_type, f"{f.dotted}: {comp['type']}"
        if f.type == "choice":
            assert [c[1] for c in props["choices"]] == list(f.choices)
        if f.type in ("int", "float", "bool", "choice") or (f.type == "str" and not f.secret):
            assert props["value"] == initial[f.section][f.key], f"{f.dotted} does not show its value"
        if f.secret:
            assert props.get("type") == "password"
        # an error line sits under every field, hidden until validation names the field
        err = by_id.get(f"err-{f.section}-{f.key}")
        assert err is not None and err["props"]["visible"] is False


def test_page_opens_with_the_demo_preset(app_config):
    studio, config = app_config
    label, cfg = studio.initial()
    assert label == "demo-sd1-lora (built-in)"
    assert cfg.model.path == "assets/demo_model"
    dropdown = next(c for c in config["components"] if c["props"].get("elem_id") == "preset-select")
    assert dropdown["props"]["value"] == label


def test_advanced_fields_are_inside_collapsed_accordions(fields, app_config):
    _, config = app_config
    comps = {c["id"]: c for c in config["components"]}
    parents: dict[int, int] = {}

    def walk(node, parent=None):
        if parent is not None:
            parents[node["id"]] = parent
        for child in node.get("children", []):
            walk(child, node["id"])
    walk(config["layout"])
    by_elem = {c["props"].get("elem_id"): c["id"] for c in config["components"]}

    def in_closed_accordion(cid):
        while cid in parents:
            cid = parents[cid]
            if comps.get(cid, {}).get("type") == "accordion":
                return comps[cid]["props"].get("open") is False
        return False
    for f in fields:
        assert in_closed_accordion(by_elem[f.elem_id]) == f.advanced, f.dotted


def test_values_round_trip_through_the_widgets(fields):
    from gui.schema_form import config_to_values, values_to_dict
    cfg = from_dict({"dataset": {"path": "x", "subsets": [{"path": "/data/a", "repeats": 3, "flip": True}],
                                 "replace_tags": {" ": "_"}, "ignore_tags": ["bad", "worse"]},
                     "network": {"target_modules": ["to_q", "to_v"]}, "schedule": {"batch_size": 3}})
    values = config_to_values(fields, cfg)
    assert to_dict(from_dict(values_to_dict(fields, values))) == to_dict(cfg)


def _values_with(fields, **changes):
    from gui.schema_form import config_to_values
    values = config_to_values(fields, TrainConfig())
    for dotted, value in changes.items():
        values[[f.dotted for f in fields].index(dotted.replace("__", "."))] = value
    return values


@pytest.mark.parametrize("dotted,value,expect", [
    ("schedule__batch_size", 0, "must be ≥ 1"),
    ("schedule__batch_size", 2.5, "whole number"),
    ("optimizer__lr", None, "number is required"),
    ("dataset__resolution", 100, "multiple"),
    ("network__type", "dora", "must be one of"),
    ("dataset__subsets", "[[subsets]]\npath = ", "not valid TOML"),
])
def test_validation_error_is_shown_next_to_the_field_it_names(fields, dotted, value, expect):
    from gui.schema_form import error_field, validate_values
    from gui.widgets import error_updates
    cfg, error = validate_values(fields, _values_with(fields, **{dotted: value}))
    assert cfg is None and isinstance(error, ConfigError)
    assert expect in str(error)
    target = error_field(fields, error)
    assert target is not None and target.dotted == dotted.replace("__", ".")
    updates = error_updates(fields, error)
    shown = [f.dotted for f, u in zip(fields, updates) if u.get("visible")]
    assert shown == [target.dotted]
    assert expect in updates[fields.index(target)]["value"]


def test_gui_never_imports_torch():
    code = ("import sys, tempfile, pathlib\n"
            "import gui.cli, gui.studio\n"
            "from gui.shared_state import Settings, Studio\n"
            "from gui.studio import build_app\n"
            "d = pathlib.Path(tempfile.mkdtemp())\n"
            "build_app(Studio.create(Settings(runs_dir=d / 'runs', presets_dir=d / 'p')))\n"
            "bad = sorted(m for m in ('torch', 'diffusers', 'transformers', 'accelerate', 'peft') if m in sys.modules)\n"
            "print('IMPORTED', bad)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "IMPORTED []" in out.stdout, out.stdout


def test_section_headings_keep_the_whole_first_paragraph(app_config):
    """A docstring wrapped over several lines is one heading, not its first line ("…are copied to")."""
    _, config = app_config
    by_id = {c["props"].get("elem_id"): c for c in config["components"] if c.get("props", {}).get("elem_id")}
    import html
    heading = html.unescape(by_id["section-cloud"]["props"]["value"])
    assert "copied to s3://<bucket>/<prefix>/<output.name>/ in the background" in heading
    assert "never from this config" in heading
    for name, section in sections().items():
        first_paragraph = (section.__doc__ or "").strip().split("\n\n")[0].split()
        assert html.unescape(by_id[f"section-{name}"]["props"]["value"]).split()[-1] == first_paragraph[-1], name


def test_labels_are_words_next_to_the_toml_key(fields, app_config):
    _, config = app_config
    by_id = {c["props"].get("elem_id"): c for c in config["components"] if c.get("props", {}).get("elem_id")}
    for f in fields:
        label = by_id[f.elem_id]["props"]["label"]
        assert label.endswith(f" · {f.key}") and len(label) > len(f.key) + 3, label
    assert by_id["field-optimizer-max_grad_norm"]["props"]["label"] == "Max grad norm · max_grad_norm"
    assert by_id["field-network-text_encoder_lr"]["props"]["label"] == "Text encoder LR · text_encoder_lr"


def test_a_reload_restores_the_form_draft_and_names_what_differs(tmp_path):
    """Issue 16 item 8: the draft kept in the browser holds every value but the secrets, puts them
    back on load, and the line under the preset bar names the fields that differ from the preset."""
    from gui.form_draft import draft_of, modified_markdown, restored_values
    from gui.shared_state import Settings, Studio
    studio = Studio.create(Settings(runs_dir=tmp_path / "runs", presets_dir=tmp_path / "presets"))
    label, values = studio.initial_values()
    fields = studio.fields
    keys = [f.dotted for f in fields]
    assert modified_markdown(studio, label, values) == ""
    edited = list(values)
    edited[keys.index("output.name")] = "my-edit"
    edited[keys.index("schedule.batch_size")] = 3
    # secret values are typed in the secrets panel, not in the form: the draft never sees them
    assert not [f for f in fields if f.secret]

    draft = draft_of(fields, label, edited)
    found = restored_values(fields, draft)
    assert found[keys.index("output.name")] == "my-edit" and found[keys.index("schedule.batch_size")] == 3
    line = modified_markdown(studio, label, edited)
    assert "2 fields differ" in line and "`output.name`" in line and "`schedule.batch_size`" in line, line
    # nothing usable: no draft yet, or one written by another schema
    assert restored_values(fields, None) is None and restored_values(fields, {"values": {"old.key": 1}}) is None
