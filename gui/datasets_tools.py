"""The Datasets page's tools: create a dataset, add images and clips (files or a .zip, a folder copied
from disk), kohya subsets and repeats, delete (studio-made datasets only, pressed twice), bulk caption
edits (preview, then apply; undo), excluded images restored. Every action calls
trainer_backend.workbench and shows its one-line refusal as it is."""
from __future__ import annotations

import time
from pathlib import Path

import gradio as gr

from trainer_backend.workbench import EditError, JournalError, Operation, apply_plan, entries, plan_edit, preview, undo
from trainer_backend.workbench.clips import is_clip_name
from trainer_backend.workbench.library import (LibraryError, add_files, add_zip, create_dataset, delete_dataset,
                                               excluded, import_folder, make_subset, restore, set_repeats, subsets,
                                               within)

CONFIRM_WINDOW_S = 10.0
OPERATIONS = [("add a trigger word at the start", "prepend"), ("add a word at the end", "append"),
              ("find and replace", "replace"), ("remove a tag", "remove_tag"), ("rename a tag", "rename_tag")]


def build_tools(page, chooser, settings, state, filters, grid_out, grid_outputs, message) -> None:
    """Lay out the tools under the grid and wire them (page: gui.datasets_page.DatasetsPage)."""
    def regrid(*filter_values):
        return grid_outputs(*filter_values, page_no=0)

    with gr.Accordion("Bulk caption edit", open=True):
        with gr.Row(equal_height=True):
            operation = gr.Dropdown(choices=OPERATIONS, value="prepend", label="Edit", elem_id="ds-bulk-op", scale=2)
            text = gr.Textbox(label="Text / find / tag", elem_id="ds-bulk-text", scale=2)
            new = gr.Textbox(label="Replace with / new tag name", elem_id="ds-bulk-new", scale=2)
            regex = gr.Checkbox(label="regular expression", elem_id="ds-bulk-regex", scale=1)
            scope = gr.Radio(choices=[("whole dataset", "all"), ("shown (filtered) images", "shown")], value="all",
                             label="Apply to", elem_id="ds-bulk-scope", scale=2)
        with gr.Row():
            show_plan = gr.Button("Preview", elem_id="ds-bulk-preview")
            apply_btn = gr.Button("Apply", variant="primary", elem_id="ds-bulk-apply", interactive=False)
            undo_btn = gr.Button("Undo the last edit", elem_id="ds-undo")
        plan_text = gr.Textbox(label="Preview", lines=6, interactive=False, elem_id="ds-bulk-plan")
    planned = gr.State(None)

    with gr.Accordion("Add images", open=False):
        with gr.Row(equal_height=True):
            name = gr.Textbox(label="New dataset name", elem_id="ds-new-name", scale=2)
            create = gr.Button("Create dataset", elem_id="ds-create", scale=1)
            delete = gr.Button("Delete dataset", variant="stop", elem_id="ds-delete", scale=1)
        with gr.Row(equal_height=True):
            target = gr.Dropdown(choices=[("the dataset's top folder", "")], value="", label="Add into",
                                 elem_id="ds-target", scale=2)
            upload = gr.File(file_count="multiple", label="Drop images, clips and captions, or a .zip", type="filepath",
                             elem_id="ds-upload", scale=3)
        with gr.Row(equal_height=True):
            source = gr.Textbox(label="Import a folder (copied, never moved)", elem_id="ds-import-path", scale=3)
            import_btn = gr.Button("Import", elem_id="ds-import", scale=1)
        with gr.Row(equal_height=True):
            concept = gr.Textbox(label="Subset concept (kohya N_concept)", elem_id="ds-concept", scale=2)
            repeats = gr.Number(value=10, precision=0, minimum=1, label="Repeats", elem_id="ds-repeats", scale=1)
            add_subset = gr.Button("Add subset / set its repeats", elem_id="ds-subset", scale=1)
        with gr.Row(equal_height=True):
            hidden = gr.Dropdown(choices=[], label="Excluded images", elem_id="ds-excluded", scale=3)
            restore_btn = gr.Button("Restore", elem_id="ds-restore", scale=1)
    armed = gr.State(None)

    def folder(chosen):
        return page.folder_of(chosen)

    def targets(chosen):
        try:
            subs = subsets(folder(chosen))
        except (LibraryError, OSError):
            subs = []
        return gr.update(choices=[("the dataset's top folder", "")] + [(f"{n} ({r} repeats)", n) for n, r, _ in subs])

    def after(note, *filter_values):
        out = regrid(*filter_values)
        out[2] = note
        return out

    def scope_images(chosen, settings_value, state_value, scope_value, control_value):
        view = page.view(chosen, settings_value, control_value)
        chosen_items = (view.items if scope_value == "all" else [view.items[i] for i in state_value.get("indices", [])])
        return view, [i["path"] for i in chosen_items]

    def operation_of(op, text_value, new_value, regex_value):
        return Operation(op, text_value or "", new_value or "", bool(regex_value))

    def on_preview(chosen, settings_value, state_value, control_value, op, text_value, new_value, regex_value,
                   scope_value):
        try:
            view, images = scope_images(chosen, settings_value, state_value, scope_value, control_value)
            operation = operation_of(op, text_value, new_value, regex_value)
            changes = plan_edit(view.folder, images, operation, view.settings.caption_extension)
        except (EditError, LibraryError) as e:
            return f"⚠️ {e}", None, gr.update(interactive=False)
        return preview(changes), {"folder": str(view.folder), "changes": changes, "label": operation.label()}, \
            gr.update(interactive=bool(changes))
    plan_in = [chooser, settings, state, filters[-1], operation, text, new, regex, scope]
    show_plan.click(on_preview, inputs=plan_in, outputs=[plan_text, planned, apply_btn], concurrency_id="ds-edit")

    def on_apply(planned_value, *filter_values):
        if not planned_value:
            return ["Preview the edit first.", None, gr.update(interactive=False), *[gr.skip()] * len(grid_out)]
        try:
            apply_plan(Path(planned_value["folder"]), planned_value["changes"], planned_value["label"])
        except EditError as e:
            return [f"⚠️ {e}", None, gr.update(interactive=False), *[gr.skip()] * len(grid_out)]
        note = f"Applied: {planned_value['label']} ({len(planned_value['changes'])} captions). **Undo** reverts it."
        return [note, None, gr.update(interactive=False), *after(note, *filter_values)]
    apply_btn.click(on_apply, inputs=[planned, *filters], outputs=[plan_text, planned, apply_btn, *grid_out],
                    concurrency_id="ds-edit")

    def on_undo(*filter_values):
        try:
            dataset = folder(filter_values[0])
            entry = undo(dataset)
        except (JournalError, LibraryError) as e:
            return [f"⚠️ {e}", *[gr.skip()] * len(grid_out)]
        left = sum(1 for e in entries(dataset) if not e.undone)
        note = f"Undone: {entry.label} ({entry.files} files). {left} earlier edits can be undone."
        return [note, *after(note, *filter_values)]
    undo_btn.click(on_undo, inputs=filters, outputs=[plan_text, *grid_out], concurrency_id="ds-edit")

    def on_create(name_value):
        try:
            made = create_dataset(page.root, name_value)
        except LibraryError as e:
            return f"⚠️ {e}", gr.skip()
        return f"Created `{made}`: add images below.", gr.update(choices=page.choices(), value=made.name)
    create.click(on_create, inputs=name, outputs=[message, chooser], concurrency_id="ds-edit")

    def on_upload(files, target_value, *filter_values):
        if not files:
            return [gr.skip(), *[gr.skip()] * len(grid_out)]
        try:
            dataset = folder(filter_values[0])
            into = dataset / target_value if target_value else dataset
            paths = [Path(f) for f in files]
            zips = [p for p in paths if p.suffix.lower() == ".zip"]
            added = [a for z in zips for a in add_zip(into, z, z.name)]
            rest = [(p.name, p) for p in paths if p.suffix.lower() != ".zip"]
            added += add_files(into, rest) if rest else []
        except LibraryError as e:
            return [None, *after(f"⚠️ {e}", *filter_values)]
        return [None, *after(f"Added {counted(added)} to `{into.name}`.", *filter_values)]
    upload.upload(on_upload, inputs=[upload, target, *filters], outputs=[upload, *grid_out], concurrency_id="ds-edit")

    def on_import(source_value, target_value, *filter_values):
        try:
            dataset = folder(filter_values[0])
            src = Path(source_value or "").expanduser()
            if not within(src, page.roots()):
                raise LibraryError(f"{src}: outside the folders the studio may read (add it with --allow-dataset-dir)")
            added = import_folder(src, dataset / target_value if target_value else dataset)
        except LibraryError as e:
            return after(f"⚠️ {e}", *filter_values)
        return after(f"Copied {counted(added)} from `{src}`.", *filter_values)
    import_btn.click(on_import, inputs=[source, target, *filters], outputs=grid_out, concurrency_id="ds-edit")

    def on_subset(concept_value, repeats_value, chosen):
        try:
            dataset = folder(chosen)
            existing = [n for n, _, c in subsets(dataset) if c == (concept_value or "").strip()]
            made = (set_repeats(dataset, existing[0], int(repeats_value or 0)) if existing
                    else make_subset(dataset, concept_value, int(repeats_value or 0)))
        except (LibraryError, OSError) as e:
            return f"⚠️ {e}", gr.skip()
        return f"Subset `{made.name}`: {made.name.split('_', 1)[0]} repeats.", targets(chosen)
    add_subset.click(on_subset, inputs=[concept, repeats, chooser], outputs=[message, target], concurrency_id="ds-edit")
    chooser.change(targets, inputs=chooser, outputs=target, show_progress="hidden")
    chooser.change(lambda c: gr.update(choices=_excluded(page, c), value=None), inputs=chooser, outputs=hidden,
                   show_progress="hidden")

    def on_restore(rel, *filter_values):
        try:
            restore(folder(filter_values[0]), rel or "")
        except LibraryError as e:
            return [gr.skip(), *after(f"⚠️ {e}", *filter_values)]
        return [gr.update(choices=_excluded(page, filter_values[0]), value=None),
                *after(f"Restored `{rel}`.", *filter_values)]
    restore_btn.click(on_restore, inputs=[hidden, *filters], outputs=[hidden, *grid_out], concurrency_id="ds-edit")

    def on_delete(chosen, armed_value):
        try:
            dataset = folder(chosen)
        except LibraryError as e:
            return f"⚠️ {e}", None, gr.skip()
        if not armed_value or armed_value[0] != str(dataset) or time.time() - armed_value[1] > CONFIRM_WINDOW_S:
            return (f"Press **Delete dataset** again within {CONFIRM_WINDOW_S:.0f} s to delete `{dataset}` and its "
                    f"images and captions."), (str(dataset), time.time()), gr.skip()
        try:
            delete_dataset(dataset)
        except LibraryError as e:
            return f"⚠️ {e}", None, gr.skip()
        return f"Deleted `{dataset}`.", None, gr.update(choices=page.choices(), value=None)
    delete.click(on_delete, inputs=[chooser, armed], outputs=[message, armed, chooser], concurrency_id="ds-edit")


def counted(added: list[Path]) -> str:
    """'4 images', or '2 images and 1 clips' when clips came too."""
    clips = sum(1 for p in added if is_clip_name(p.name))
    return f"{len(added) - clips} images" + (f" and {clips} clips" if clips else "")


def _excluded(page, chosen) -> list[str]:
    try:
        return excluded(page.folder_of(chosen))
    except (LibraryError, OSError):
        return []
