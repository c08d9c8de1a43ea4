"""The Training form survives a browser reload: its values (never its secrets) are kept in the
browser's localStorage as a draft and put back when the page loads, and a line under the preset
bar says which fields differ from the preset they started from."""
from __future__ import annotations

from typing import Any

import gradio as gr

from gui.presets import PresetError
from gui.schema_form import FormField, config_to_values
from gui.shared_state import Studio
from gui.training_page import EditHook
from gui.widgets import FormWidgets, jsonable

STORAGE_KEY = "sd-studio-training-form"
SHOWN_NAMES = 6   # the changed fields named in the line; the rest are counted


def draft_of(fields: list[FormField], preset: str | None, values: list) -> dict:
    """What is stored: the preset the form came from and every non-secret value by its dotted key."""
    return {"preset": preset or "",
            "values": {f.dotted: jsonable(v) for f, v in zip(fields, values) if not f.secret}}


def restored_values(fields: list[FormField], draft: Any) -> dict[int, Any] | None:
    """Field index -> value to put back into the form (never a secret; keys the draft lacks keep
    the form's value), or None when there is no usable draft (none yet, another schema's, not a
    dict)."""
    if not isinstance(draft, dict) or not isinstance(draft.get("values"), dict):
        return None
    stored = draft["values"]
    found = {i: stored[f.dotted] for i, f in enumerate(fields) if f.dotted in stored and not f.secret}
    return found or None


def changed_fields(fields: list[FormField], values: list, baseline: list) -> list[str]:
    return [f.dotted for f, v, b in zip(fields, values, baseline)
            if not f.secret and jsonable(v) != jsonable(b)]


def modified_markdown(studio: Studio, preset: str | None, values: list) -> str:
    """"" when the form equals its preset; else which fields differ (unsaved until Save)."""
    if not preset:
        return ""
    try:
        baseline = config_to_values(studio.fields, studio.load_preset(preset))
    except (PresetError, Exception):   # a preset deleted meanwhile: nothing to compare with
        return ""
    changed = changed_fields(studio.fields, values, baseline)
    if not changed:
        return ""
    names = ", ".join(f"`{k}`" for k in changed[:SHOWN_NAMES])
    more = f" and {len(changed) - SHOWN_NAMES} more" if len(changed) > SHOWN_NAMES else ""
    verb = "fields differ" if len(changed) != 1 else "field differs"
    return (f"✎ {len(changed)} {verb} from preset **{preset}** "
            f"(not saved in it): {names}{more}")


class FormDraft:
    """The draft in the browser and the "differs from the preset" line. The draft is saved by the
    form's own refresh (`on_edit`: every edit and every load chains one) and when the chosen preset
    changes (Save as, Delete)."""

    def __init__(self, studio: Studio, dropdown: gr.Dropdown, marker: gr.Markdown):
        self.studio, self.dropdown, self.marker = studio, dropdown, marker
        self.state = gr.BrowserState(None, storage_key=STORAGE_KEY)

    def remember(self, preset, *values):
        fields = self.studio.fields
        return draft_of(fields, preset, list(values)), modified_markdown(self.studio, preset, list(values))

    def on_preset_change(self, preset, *values):
        """The chosen preset changed: Save as (the form equals the new preset), Delete (no preset), a
        choice not loaded yet, a Load or a restore whose values the form's `values` does not hold yet
        (the browser merges them after this event is sent). Only the first two are certain here: the
        line is cleared and the draft saved when the form equals the preset (or there is none); else
        both are left to the refresh that every Load and restore chains (issue 29 item 4: a stale
        comparison said "27 fields differ" right after a Load, once for good after a reload)."""
        draft, line = self.remember(preset, *values)
        return (draft, line) if not line else (gr.skip(), gr.skip())

    def on_edit(self) -> EditHook:
        """The draft's part of the form refresh: the preset label in, the draft and the line out."""
        return EditHook(inputs=[self.dropdown], outputs=[self.state, self.marker],
                        fn=lambda values, preset: list(self.remember(preset, *values)))

    def wire(self, app: gr.Blocks, form: FormWidgets, refresh_event) -> None:
        """Save when the chosen preset changes; restore on page load, then `refresh_event(event)`
        (which refreshes the form and saves the draft again)."""
        studio, fields, inputs = self.studio, self.studio.fields, form.inputs
        self.dropdown.change(form.reading(self.on_preset_change, at=1), inputs=[self.dropdown, form.values],
                             outputs=[self.state, self.marker], trigger_mode="always_last", show_progress="hidden")

        def restore(stored, preset, *current):
            found = restored_values(fields, stored)
            if found is None:
                return [gr.skip()] * (len(inputs) + 2)
            label = stored.get("preset") or preset
            if label not in studio.store.labels():
                label = None   # deleted meanwhile: the values stay, nothing to compare them with
            values = [found.get(i, v) for i, v in enumerate(current)]
            updates = [found[i] if i in found else gr.skip() for i in range(len(fields))]
            # the page's choices were built with the studio: presets saved since must be choices too
            return [*updates, gr.update(choices=studio.store.labels(), value=label),
                    modified_markdown(studio, label, values)]

        refresh_event(app.load(form.loading(restore, at=2), inputs=[self.state, self.dropdown, form.values],
                               outputs=[*inputs, self.dropdown, self.marker, form.patch], show_progress="hidden"))
