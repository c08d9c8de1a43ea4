"""Preset bar (load, save, save as, delete, reset) and the kohya_ss import, above the form."""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import gradio as gr

from trainer_backend.config import ConfigError, from_dict

from gui.shared_state import Studio, overlay, preset_error_text
from gui.kohya_import import (ImportProblem, convert_warmup, import_kohya, planned_steps, read_kohya_file,
                              report_markdown)
from gui.presets import PresetError, sanitize_name
from gui.schema_form import config_to_values, validate_values
from gui.widgets import FormWidgets

CONFIRM_WINDOW_S = 10.0


@dataclass
class PresetPanel:
    dropdown: gr.Dropdown
    load: gr.Button
    save: gr.Button
    name: gr.Textbox
    save_as: gr.Button
    delete: gr.Button
    reset: gr.Button
    message: gr.Markdown
    kohya_file: gr.File
    kohya_name: gr.Textbox
    kohya_button: gr.Button
    kohya_report: gr.Markdown
    armed: gr.State
    expire: gr.Timer          # clears the "press Delete again" message when its window has passed
    kohya_family: gr.Dropdown | None = None  # the family for the import (kohya_ss has no key for the newer ones)


def kohya_family_choices() -> list[tuple[str, str]]:
    """The import's family choice: the file's own keys, or any registered family (the registry's labels)."""
    from trainer_backend.families.registry import FAMILIES
    return [("From the file's keys (SD1/2, SDXL, SD3, Flux)", "")] + [(e.label, e.name) for e in FAMILIES]


def build_preset_panel(studio: Studio, initial_label: str | None) -> PresetPanel:
    with gr.Column(elem_id="preset-bar"):
        with gr.Row(equal_height=False, elem_classes=["preset-row"]):
            dropdown = gr.Dropdown(choices=studio.store.labels(), value=initial_label, label="Preset",
                                   elem_id="preset-select", scale=3, allow_custom_value=False)
            load = gr.Button("Load", elem_id="preset-load", scale=0, min_width=90, size="md")
            save = gr.Button("Save", elem_id="preset-save", scale=0, min_width=90, size="md")
            name = gr.Textbox(label="Save as (name)", placeholder="my-preset", elem_id="preset-name", scale=2)
            save_as = gr.Button("Save as", elem_id="preset-save-as", scale=0, min_width=90, size="md")
            delete = gr.Button("Delete", elem_id="preset-delete", scale=0, min_width=90, size="md",
                               variant="stop")
            reset = gr.Button("Reset to defaults", elem_id="preset-reset", scale=0, min_width=150,
                              size="md")
    message = gr.Markdown("", elem_id="preset-message")
    with gr.Accordion("Import a kohya_ss config (JSON)", open=False, elem_id="kohya-import"):
        with gr.Row():
            kohya_file = gr.File(label="kohya_ss config or preset (.json)", file_types=[".json"], type="filepath",
                                 elem_id="kohya-file", scale=2)
            with gr.Column(scale=1):
                kohya_name = gr.Textbox(label="Save as preset named", placeholder="from the file name",
                                        elem_id="kohya-name")
                kohya_family = gr.Dropdown(choices=kohya_family_choices(), value="", label="Family",
                                           info="kohya_ss has keys for SD1/2, SDXL, SD3 and Flux only: choose "
                                                "another family here", elem_id="kohya-family")
                kohya_button = gr.Button("Import and save as preset", elem_id="kohya-import-button")
        kohya_report = gr.Markdown("", elem_id="kohya-report")
    return PresetPanel(dropdown, load, save, name, save_as, delete, reset, message, kohya_file, kohya_name,
                       kohya_button, kohya_report, gr.State(None), gr.Timer(CONFIRM_WINDOW_S, active=False),
                       kohya_family)


def wire_preset_panel(panel: PresetPanel, studio: Studio, form: FormWidgets, after_load) -> None:
    """Connect the buttons; `after_load(event)` chains the form refresh after values change. The
    buttons read the form's values from `form.values` (gui/widgets.py says why)."""
    fields, inputs = studio.fields, form.inputs
    secret_idx = [i for i, f in enumerate(fields) if f.secret]

    def with_current_secrets(values: list, current: list) -> list:
        # presets never hold secrets; keep whatever the user typed in this page
        for i in secret_idx:
            values[i] = current[i]
        return values

    def changed_only(values: list, current: list) -> list:
        # a value the form already holds is not re-sent: its widget is not redrawn, and fires no change event
        return [gr.skip() if v == c else v for v, c in zip(values, current, strict=True)]

    def choices(selected: str | None) -> dict:
        return gr.update(choices=studio.store.labels(), value=selected)

    def on_load(label, *current):
        if not label:
            return [gr.skip()] * len(inputs) + ["Choose a preset first.", gr.skip()]
        note = ""
        try:
            preset = studio.store.find(label)
            tier = studio.preset_for_card(preset)
            if tier.name != preset.name:   # a tiered preset: the tier planned for the detected card
                note = f" (the {tier.name.rsplit('-', 1)[-1].upper()} tier of **{preset.label}**, for this GPU)"
                preset = tier
            cfg = studio.load_preset(preset.label)
        except PresetError as e:
            return [gr.skip()] * len(inputs) + [preset_error_text(e), gr.skip()]
        values = with_current_secrets(config_to_values(fields, cfg), list(current))
        return [*changed_only(values, list(current)), f"Loaded **{preset.label}**{note}.",
                "" if preset.builtin else preset.name]

    ev = panel.load.click(form.loading(on_load, at=1), inputs=[panel.dropdown, form.values],
                          outputs=[*inputs, panel.message, panel.name, form.patch],
                          show_progress_on=panel.message)
    after_load(ev)

    def save_named(name: str, values: list, overwrite: bool):
        cfg, error = validate_values(fields, list(values))
        if error is not None:
            return [f"⚠️ Not saved: {error}", gr.skip()]
        try:
            preset = studio.store.save(name, cfg, overwrite=overwrite)
        except PresetError as e:
            return [preset_error_text(e), gr.skip()]
        return [f"Saved **{preset.name}** to `{preset.path}` (secrets are never saved).", choices(preset.label)]

    def on_save(label, *values):
        if not label:
            return ["Choose a user preset, or use Save as.", gr.skip()]
        try:
            preset = studio.store.find(label)
        except PresetError as e:
            return [preset_error_text(e), gr.skip()]
        if preset.builtin:
            return [f"⚠️ {preset.label} is read-only: type a name and use **Save as**.", gr.skip()]
        return save_named(preset.name, values, overwrite=True)

    panel.save.click(form.reading(on_save, at=1), inputs=[panel.dropdown, form.values],
                     outputs=[panel.message, panel.dropdown])

    def on_save_as(name, *values):
        if not (name or "").strip():
            return ["Type a name for the new preset.", gr.skip()]
        try:
            existing = studio.store.user_path(name).exists()
        except PresetError as e:
            return [preset_error_text(e), gr.skip()]
        if existing:
            return [f"⚠️ A preset named '{sanitize_name(name)}' exists: select it and press **Save** to "
                    f"overwrite it, or choose another name.", gr.skip()]
        return save_named(name, values, overwrite=False)

    panel.save_as.click(form.reading(on_save_as, at=1), inputs=[panel.name, form.values],
                        outputs=[panel.message, panel.dropdown])

    def on_delete(label, armed):
        """Two clicks within CONFIRM_WINDOW_S: the first arms, the second deletes."""
        off = gr.Timer(active=False)
        if not label:
            return ["Choose a preset to delete.", None, gr.skip(), off]
        try:
            preset = studio.store.find(label)
        except PresetError as e:
            return [preset_error_text(e), None, gr.skip(), off]
        if preset.builtin:
            return [f"⚠️ {preset.label} is read-only and cannot be deleted.", None, gr.skip(), off]
        if not armed or armed[0] != label or time.time() - armed[1] > CONFIRM_WINDOW_S:
            return [f"Press **Delete** again within {CONFIRM_WINDOW_S:.0f} s to delete '{preset.name}'.",
                    (label, time.time()), gr.skip(), gr.Timer(active=True)]
        studio.store.delete(label)
        return [f"Deleted preset '{preset.name}'.", None, choices(None), off]

    panel.delete.click(on_delete, inputs=[panel.dropdown, panel.armed],
                       outputs=[panel.message, panel.armed, panel.dropdown, panel.expire])
    # the confirmation window is over: its message goes with it
    panel.expire.tick(lambda: ["", None, gr.Timer(active=False)], outputs=[panel.message, panel.armed, panel.expire],
                      show_progress="hidden")

    def on_reset(*current):
        values = with_current_secrets(config_to_values(fields, studio.defaults()), list(current))
        return [*changed_only(values, list(current)), "Reset to the schema defaults.", gr.update(value=None)]

    ev = panel.reset.click(form.loading(on_reset), inputs=[form.values],
                           outputs=[*inputs, panel.message, panel.dropdown, form.patch],
                           show_progress_on=panel.message)
    after_load(ev)

    def on_import(path, name, family, *current):
        if not path:
            return [gr.skip()] * len(inputs) + ["Choose a kohya_ss .json file first.", gr.skip(), gr.skip()]
        try:
            # size-capped, then parsed with a depth limit
            result = import_kohya(read_kohya_file(path), family=family or "")
            cfg = from_dict(overlay(studio.base(), result.data))
            if result.warmup_percent is not None:  # lr_warmup in %: a share of the step plan's count
                convert_warmup(result, *planned_steps(cfg))
                cfg = from_dict(overlay(studio.base(), result.data))
            preset = studio.store.save(name or Path(path).stem, cfg, overwrite=False)
        except (ImportProblem, PresetError, ConfigError, OSError, UnicodeDecodeError) as e:
            return [gr.skip()] * len(inputs) + [gr.skip(), preset_error_text(e), gr.skip()]
        values = with_current_secrets(config_to_values(fields, cfg), list(current))
        report = f"Saved as preset **{preset.name}** and loaded into the form.\n\n" + report_markdown(result)
        return [*changed_only(values, list(current)), report, "", choices(preset.label)]

    ev = panel.kohya_button.click(form.loading(on_import, at=3),
                                  inputs=[panel.kohya_file, panel.kohya_name, panel.kohya_family, form.values],
                                  outputs=[*inputs, panel.kohya_report, panel.message, panel.dropdown, form.patch],
                                  show_progress_on=panel.message)
    after_load(ev)
