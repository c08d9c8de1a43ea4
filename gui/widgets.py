"""Gradio widgets for the schema form: one tab per schema TAB, advanced fields collapsed,
and an (initially hidden) error line under every widget for validation messages.

The events that need the whole form (its refresh, Start, Save, a preset Load) read one hidden
component, `FormWidgets.values`, that holds every field's value and is kept current in the browser
(`keep_values_in_browser`), never the ~225 widgets themselves: Gradio's page keeps a loading-status
entry for every input of every event that has completed and updates each of them, with a walk of
the whole component tree, at every status change of any event afterwards; with the form's widgets
as inputs, every tick of the Run page paid for them (docs/gui.md, "What a tick costs")."""
from __future__ import annotations

import functools
import html
import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import gradio as gr

from trainer_backend.config import ConfigError

from gui.schema_form import FormField, error_field, field_visibility, human_label, section_heading, tabs_in_order

FIELDS_PER_ROW = 3


def tab_id(tab: str) -> str:
    return "tab-" + re.sub(r"[^a-z0-9]+", "-", tab.lower()).strip("-")


@dataclass
class FormWidgets:
    fields: list[FormField]
    inputs: list[gr.components.Component]   # parallel to fields
    errors: list[gr.Markdown]               # parallel to fields
    tabs: gr.Tabs
    cells: list = field(default_factory=list)    # parallel to fields: the column holding widget and error line
    groups: list = field(default_factory=list)   # (heading or accordion, [field indices]): shown if any field is
    values: Any = None                           # hidden gr.JSON: every field's value, as the browser has it
    patch: Any = None                            # hidden gr.JSON: the values a server event set (`loading`)

    def read(self, payload: Any) -> list:
        """The form's values from `values`' payload, each as its widget's own input would give it
        (a Number's precision, a Dropdown's check of its choices)."""
        if not isinstance(payload, list) or len(payload) != len(self.inputs):
            raise gr.Error(f"the form's values did not arrive whole ({_shape(payload)} for "
                           f"{len(self.inputs)} fields): reload the page")
        return [widget.preprocess(value) for widget, value in zip(self.inputs, payload)]

    def reading(self, fn: Callable, at: int = 0) -> Callable:
        """`fn` takes the form's values as positional arguments from `at` on; the returned function
        takes `values`' one payload there instead (wire it with `self.values` among its inputs)."""
        @functools.wraps(fn)
        def wrapped(*args):
            return fn(*args[:at], *self.read(args[at]), *args[at + 1:])
        return wrapped

    def loading(self, fn: Callable, at: int = 0) -> Callable:
        """For an event that sets the form's fields (its outputs start with `self.inputs`) and reads
        the form (`values` at input `at`): the returned function also returns, last, what it set as
        `patch` (wire `self.patch` as the last output and chain `self.merge_patch`). A patch, not the
        whole list: an edit the user makes while the event runs must survive it, as it survives in
        the widgets (the event skips the values it does not change)."""
        read = self.reading(fn, at)

        @functools.wraps(fn)
        def wrapped(*args):
            out = list(read(*args))
            return [*out, patch_of(out[:len(self.inputs)])]
        return wrapped

    def merge_patch(self, event):
        """Chain the browser-side merge of the event's `patch` into `values` (no round trip);
        returns the chained event, after which `values` holds what the widgets show."""
        return event.then(None, inputs=[self.patch, self.values], outputs=[self.values], show_progress="hidden",
                          js="(patch, all) => { const v = Array.isArray(all) ? [...all] : []; "
                             "for (const [i, value] of (Array.isArray(patch) ? patch : [])) v[i] = value; "
                             "return [v]; }")

    def keep_values_in_browser(self) -> None:
        """Each field's edit writes its value into `values`, in the browser only (no round trip, no
        loading status). Registered before the form's own events, so on the same trigger it runs
        first: Gradio runs an event's listeners one after another."""
        for i, widget in enumerate(self.inputs):
            gr.on(edit_triggers(widget), None, inputs=[widget, self.values], outputs=[self.values],
                  js=f"(value, all) => {{ const v = Array.isArray(all) ? [...all] : []; v[{i}] = value; "
                     f"return [v]; }}", show_progress="hidden")

    def visibility_updates(self, visible: list[bool], invalid: list[bool] | None = None) -> list[dict]:
        """Show the options that apply, hide the rest (and a heading or accordion left empty); a field
        with a problem is highlighted (its cell gets the `field-invalid` class) and shown even where it
        does not apply (a dataset.control_path left set for a family that takes no control images)."""
        invalid = invalid or [False] * len(visible)
        shown = [v or bad for v, bad in zip(visible, invalid, strict=True)]
        cells = [gr.update(visible=v, elem_classes=cell_classes(bad)) for v, bad in zip(shown, invalid, strict=True)]
        return cells + [gr.update(visible=any(shown[i] for i in members)) for _, members in self.groups]

    @property
    def visibility_outputs(self) -> list:
        return [*self.cells, *(component for component, _ in self.groups)]


def edit_triggers(widget) -> list:
    """The events of a user's edit: a textbox's blur or Enter (not every keystroke), any other
    widget's `input`. Never `change`, which also fires for every value a function sets (a preset
    load would queue one refresh per changed field)."""
    if isinstance(widget, gr.Textbox):
        return [widget.blur, widget.submit]
    return [widget.input]


def patch_of(updates: list) -> list:
    """[[field index, value], ...] for the updates that set a value (values, gr.update(value=...));
    gr.skip() keeps the field's value and is left out."""
    patch = []
    for i, update in enumerate(updates):
        if isinstance(update, dict) and update.get("__type__") == "update":
            if "value" in update:
                patch.append([i, jsonable(update["value"])])
        else:
            patch.append([i, jsonable(update)])
    return patch


def jsonable(value: Any) -> Any:
    """The value, or its text where JSON cannot hold it (a browser's storage, the values component)."""
    try:
        json.dumps(value, allow_nan=False)
        return value
    except (TypeError, ValueError):
        return str(value)


def _shape(payload: Any) -> str:
    return f"{len(payload)} values" if isinstance(payload, list) else type(payload).__name__


def cell_classes(invalid: bool) -> list[str]:
    """CSS classes of a field's cell: `field-invalid` outlines the widget of a field with a problem."""
    return ["field-cell", "field-invalid"] if invalid else ["field-cell"]


def _number_step(f: FormField) -> float:
    if f.type == "int":
        return 1
    magnitude = abs(f.default) if isinstance(f.default, (int, float)) and f.default else 0.01
    return 10 ** math.floor(math.log10(magnitude))


def make_widget(f: FormField, value: Any) -> gr.components.Component:
    """The widget for one field: type, choices and help come from the schema. Bounds are shown
    in the help text and enforced by the schema's validation (so the message names the key)."""
    common = dict(label=human_label(f), info=f.info(), elem_id=f.elem_id, interactive=True)
    if f.type == "bool":
        return gr.Checkbox(value=bool(value), **common)
    if f.type == "choice":
        if f.widget == "radio":
            return gr.Radio(choices=list(f.choices), value=value, **common)
        return gr.Dropdown(choices=list(f.choices), value=value, **common)
    if f.type in ("int", "float"):
        low, high = f.bounds.get("ge"), f.bounds.get("le")
        if f.widget == "slider" and low is not None and high is not None:
            return gr.Slider(minimum=low, maximum=high, value=value, step=_number_step(f), **common)
        return gr.Number(value=value, precision=0 if f.type == "int" else None, step=_number_step(f), **common)
    if f.secret:
        return gr.Textbox(value=value, type="password", placeholder="kept in memory and the run's environment only",
                          **common)
    if f.edited_as_toml:
        return gr.Textbox(value=value, lines=4, max_lines=20, elem_classes=["toml-field"], **common)
    lines = 4 if f.widget == "textarea" else 1
    placeholder = "path on this machine" if f.widget == "path" else None
    return gr.Textbox(value=value, lines=lines, max_lines=12 if lines > 1 else 1, placeholder=placeholder, **common)


def _field_cell(f: FormField, value: Any, inputs: dict, errors: dict, cells: dict, visible: dict) -> None:
    with gr.Column(min_width=220, visible=visible[f.dotted], elem_classes=cell_classes(False),
                   elem_id=f"cell-{f.section}-{f.key}") as cell:
        cells[f.dotted] = cell
        inputs[f.dotted] = make_widget(f, value)
        errors[f.dotted] = gr.Markdown("", visible=False, elem_classes=["field-error"],
                                       elem_id=f"err-{f.section}-{f.key}")


def _field_rows(fields: list[FormField], values: dict, inputs: dict, errors: dict, cells: dict,
                visible: dict) -> None:
    for start in range(0, len(fields), FIELDS_PER_ROW):
        with gr.Row(equal_height=False):
            for f in fields[start:start + FIELDS_PER_ROW]:
                _field_cell(f, values[f.dotted], inputs, errors, cells, visible)


def render_form(fields: list[FormField], values: list[Any],
                extras: dict[str, Callable[[], None]] | None = None, extra_tabs: list[tuple[str, Callable]] = ()
                ) -> FormWidgets:
    """Render the tabs. `extras[tab]()` adds non-schema content (plan, inspector) at the end of
    that tab; `extra_tabs` are appended as whole tabs (command preview)."""
    extras = dict(extras or {})
    by_dotted = {f.dotted: v for f, v in zip(fields, values, strict=True)}
    inputs: dict[str, Any] = {}
    errors: dict[str, Any] = {}
    cells: dict[str, Any] = {}
    groups: list = []
    index = {f.dotted: i for i, f in enumerate(fields)}
    visible = dict(zip(index, field_visibility(fields, values)))
    with gr.Tabs(elem_id="form-tabs") as tabs:
        for tab in tabs_in_order(fields):
            with gr.Tab(tab, id=tab_id(tab), elem_id=tab_id(tab)):
                in_tab = [f for f in fields if f.tab == tab]
                for section in dict.fromkeys(f.section for f in in_tab):
                    section_fields = [f for f in in_tab if f.section == section]
                    heading = html.escape(section_heading(section), quote=False)   # `<bucket>` is text, not a tag
                    members = [index[f.dotted] for f in section_fields]
                    title = gr.Markdown(f"#### `[{section}]` {heading}", elem_classes=["section-title"],
                                        elem_id=f"section-{section}",
                                        visible=any(visible[f.dotted] for f in section_fields))
                    groups.append((title, members))
                    _field_rows([f for f in section_fields if not f.advanced], by_dotted, inputs, errors, cells,
                                visible)
                    advanced = [f for f in section_fields if f.advanced]
                    if advanced:
                        with gr.Accordion(f"Advanced [{section}]", open=False,
                                          visible=any(visible[f.dotted] for f in advanced)) as accordion:
                            _field_rows(advanced, by_dotted, inputs, errors, cells, visible)
                        groups.append((accordion, [index[f.dotted] for f in advanced]))
                if tab in extras:
                    extras.pop(tab)()
        for title, build in [*extra_tabs, *extras.items()]:
            with gr.Tab(title, id=tab_id(title), elem_id=tab_id(title)):
                build()
    form = FormWidgets(fields=fields, inputs=[inputs[f.dotted] for f in fields],
                       errors=[errors[f.dotted] for f in fields], tabs=tabs,
                       cells=[cells[f.dotted] for f in fields], groups=groups,
                       values=gr.JSON([jsonable(v) for v in values], visible=False, elem_id="form-values"),
                       patch=gr.JSON([], visible=False, elem_id="form-patch"))
    form.keep_values_in_browser()
    return form


def error_updates(fields: list[FormField], error: ConfigError | str | list | None) -> list[dict]:
    """One update per error line: each message shown under the field it names (several at once when
    given a list), the other lines hidden."""
    errors = error if isinstance(error, list) else ([error] if error else [])
    shown: dict[str, list[str]] = {}
    for e in errors:
        target = error_field(fields, e)
        if target is not None:
            shown.setdefault(target.dotted, []).append(f"⚠️ {e}")
    return [gr.update(value="  \n".join(shown[f.dotted]), visible=True) if f.dotted in shown
            else gr.update(value="", visible=False) for f in fields]


def update_key(update) -> str:
    """What an update sets, comparable across events (gr.update dicts, plain values)."""
    return repr(sorted(update.items())) if isinstance(update, dict) else repr(update)


def only_changed(updates: list, previous: list | None) -> tuple[list, list]:
    """(updates with gr.skip() where the same update was sent last time, the keys to remember).
    The form's 200-odd error lines and cells are refreshed on every change: the browser re-renders
    only the ones that differ."""
    keys = [update_key(u) for u in updates]
    if not previous or len(previous) != len(keys):
        return updates, keys
    return [gr.skip() if k == p else u for u, k, p in zip(updates, keys, previous)], keys


def shown_errors(updates: list) -> list[bool]:
    """Per field, from `error_updates`' result: does its error line show (the field is invalid)?"""
    return [isinstance(u, dict) and bool(u.get("visible")) for u in updates]


def unplaced_errors(fields: list[FormField], errors: list) -> str:
    """The errors that name no field of the form (shown above it)."""
    return "  \n".join(f"⚠️ {e}" for e in errors if error_field(fields, e) is None)
