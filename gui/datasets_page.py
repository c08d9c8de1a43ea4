"""The Datasets page: the datasets folder, one dataset's thumbnail grid (paged, filtered), an
image's detail with the trainer's crop drawn, the caption editor (Alt+←/→ previous/next, Ctrl+S
save), bulk caption edits with preview and undo, tag frequencies, duplicates excluded in one click,
and "Train on this dataset". The backend is trainer_backend.workbench (the `dataset` CLI calls the
same functions); bringing images in and bulk edits are wired in gui/datasets_tools.py."""
from __future__ import annotations

import atexit
import hashlib
import json
from pathlib import Path

import gradio as gr
import pandas as pd

from trainer_backend.config import ConfigError
from trainer_backend.data.caption_json import readable
from trainer_backend.workbench import CheckSettings, EditError, JournalError, read_index, save_caption
from trainer_backend.workbench.clips import is_clip_name
from trainer_backend.workbench.library import LibraryError, exclude, list_datasets, within

from gui.datasets_model import FLAG_LABELS, PAGE_SIZE, Indexer, Views, detail_picture, grid_label, page_of, \
    thumb_or_placeholder
from gui.datasets_clips import VIDEO_KEYS, clip_detail, clip_lines
from gui.datasets_grid import GRID_JS, grid_cells, grid_html
from gui.schema_form import from_widget_value
from gui.shared_state import Studio
from gui.widgets import FormWidgets

DATASET_COLUMNS = ["dataset", "images", "clips", "captioned", "flagged", "made here"]
SETTING_KEYS = ("resolution", "bucketing", "bucket_min_side", "bucket_max_side", "bucket_step", "bucket_no_upscale",
                "center_crop", "caption_extension")
KEYS_JS = """() => { if (window.__datasetKeys) return; window.__datasetKeys = true;
  document.addEventListener('keydown', (e) => {
    const page = document.querySelector('#page-datasets');
    if (!page || page.offsetParent === null) return;
    const click = (id) => { const b = document.querySelector(id); if (b) { e.preventDefault(); b.click(); } };
    if (e.altKey && e.key === 'ArrowRight') click('#ds-next');
    else if (e.altKey && e.key === 'ArrowLeft') click('#ds-prev');
    else if ((e.ctrlKey || e.metaKey) && e.key === 's') click('#ds-save');
  }); (""" + GRID_JS + """)(); }"""


class DatasetsPage:
    """The page's components and the studio-wide helpers its events share."""

    def __init__(self, studio: Studio):
        self.studio = studio
        self.root = Path(studio.settings.datasets_dir)
        self.cache = self.root / ".cache"
        self.views = Views(self.cache)
        self.indexer = Indexer(self.cache, studio.settings.python)
        atexit.register(self.indexer.stop_all)   # a thumbnailer never outlives the studio
        # thumbnails are named by their content and never change: Gradio serves them in place instead of
        # hashing and copying a page's 60 files into its cache at every page change (50-100 ms)
        (self.cache / "thumbs").mkdir(parents=True, exist_ok=True)
        gr.set_static_paths([str(self.cache / "thumbs")])

    def roots(self) -> list[Path]:
        return [self.root, *self.studio.settings.dataset_roots]

    def folder_of(self, chosen: str) -> Path:
        """A dataset name under the datasets folder, or a folder path inside the allowed roots."""
        if not chosen:
            raise LibraryError("choose or create a dataset first")
        folder = Path(chosen).expanduser() if ("/" in chosen or chosen.startswith("~")) else self.root / chosen
        if not within(folder, self.roots()):
            raise LibraryError(f"{folder}: outside the folders the studio may open "
                               f"({', '.join(str(r) for r in self.roots())}; add one with --allow-dataset-dir)")
        if not folder.is_dir():
            raise LibraryError(f"{folder}: no such folder")
        return folder

    def table(self) -> pd.DataFrame:
        """The datasets folder's datasets and their counts (flagged: of the images indexed so far, by the
        checks that need no training settings)."""
        rows = []
        for info in list_datasets(self.root) if self.root.is_dir() else []:
            known = read_index(self.cache, info.path)
            flagged = sum(1 for r in known.values() if r.get("flags"))
            rows.append([info.name, info.images, info.clips, info.captioned, f"{flagged} of {len(known)} checked",
                         "yes" if info.made_here else "no"])
        return pd.DataFrame(rows, columns=DATASET_COLUMNS)

    def choices(self, extra: str = "") -> list[str]:
        names = [d.name for d in list_datasets(self.root)] if self.root.is_dir() else []
        return names + ([extra] if extra and extra not in names else [])

    def view(self, chosen: str, settings: dict, control_root: str = ""):
        """The dataset's view; starts the background indexer when files are not indexed yet."""
        folder = self.folder_of(chosen)
        view = self.views.get(folder, CheckSettings.from_values(settings), control_root, video=settings)
        if view.indexed < len(view.items):
            self.indexer.ensure(folder)
        return view


def settings_from_form(form: FormWidgets, payload) -> dict:
    """The [dataset] values of the Training form that decide buckets and crops."""
    values = {}
    for f, raw in zip(form.fields, form.read(payload)):
        try:   # as the schema reads the widget (a list field's text as a list)
            values[f.dotted] = from_widget_value(f, raw)
        except ConfigError:
            values[f.dotted] = raw   # the Training page names the field; the clips' summary does too
    out = {k: values[f"dataset.{k}"] for k in (*SETTING_KEYS, *VIDEO_KEYS) if f"dataset.{k}" in values}
    out.update({k: values[k] for k in ("model.arch", "model.path") if k in values})   # a clip's frame rule
    return out


def summary_markdown(view, running: bool) -> str:
    counts = view.counts()
    captioned = sum(1 for i in view.items if i.get("caption") is not None)
    flagged = sum(1 for i in view.items if i["flags"])
    clips = view.clip_count()
    images = len(view.items) - clips
    what = (f"{images} images, {clips} clips" if images else f"{clips} clips") if clips else f"{images} images"
    head = (f"**{what}** · {captioned} captioned · {flagged} flagged"
            + (f" · thumbnails {view.indexed}/{len(view.items)} (making the rest in the background)"
               if view.indexed < len(view.items) or running else ""))
    details = [f"{FLAG_LABELS[k]} {n}" for k, n in counts.items() if n]
    dup = len(view.groups)
    return (head + (f"  \n{' · '.join(details)}" if details else "") + (f"  \n{dup} duplicate groups" if dup else "")
            + "".join(f"  \n{line}" for line in clip_lines(view)))


def build_datasets_page(studio: Studio, form: FormWidgets, form_after_load, main_tabs: gr.Tabs, tab: gr.Tab):
    """The Datasets page; returns (its refresh timer, the page helper) (the timer runs while the tab is shown)."""
    page = DatasetsPage(studio)
    from gui.datasets_tools import build_tools
    with gr.Row(equal_height=True):
        chooser = gr.Dropdown(choices=page.choices(), value=None, label="Dataset", allow_custom_value=True, scale=3,
                              elem_id="ds-choose", info=f"a dataset in {page.root}, or a folder path to open")
        refresh = gr.Button("Refresh", elem_id="ds-refresh", scale=0, min_width=100)
        train = gr.Button("Train on this dataset", variant="primary", elem_id="ds-train", scale=1)
    with gr.Accordion("All datasets", open=False):
        datasets_table = gr.Dataframe(value=page.table(), headers=DATASET_COLUMNS, interactive=False,
                                      elem_id="ds-list", max_height=240)
    summary = gr.Markdown("", elem_id="ds-summary")
    message = gr.Markdown("", elem_id="ds-message")
    settings = gr.State({})
    state = gr.State({"indices": [], "page": 0, "selected": None, "loaded": None})
    with gr.Row(equal_height=True):
        flag = gr.Dropdown(choices=[("all images", ""), ("any flag", "flagged"), ("clips only", "clips"),
                                    ("images only", "images")]
                           + [(label, kind) for kind, label in FLAG_LABELS.items()], value="", label="Show",
                           elem_id="ds-filter", scale=2)
        tag = gr.Textbox(label="With tag", elem_id="ds-tag", scale=2)
        bucket = gr.Dropdown(choices=[("any bucket", "")], value="", label="Bucket", elem_id="ds-bucket", scale=1)
        control = gr.Textbox(label="Control images folder (edit pairs)", elem_id="ds-control", scale=2)
    grid = gr.HTML("", elem_id="ds-grid", js_on_load=None)
    # a thumbnail's click sends its position in the filtered list (gui/datasets_grid.py)
    pick = gr.Textbox(elem_id="ds-pick", visible="hidden")
    pick_go = gr.Button(elem_id="ds-pick-go", visible="hidden")
    with gr.Row(equal_height=False):
        with gr.Column(scale=3):
            picture = gr.Image(type="pil", interactive=False, label="The crop the trainer takes (red)",
                               elem_id="ds-picture", height=460)
            player = gr.Video(label="The clip (its first window, as the trainer samples it)", elem_id="ds-clip",
                              interactive=False, autoplay=True, loop=True, visible=False, height=300)
        with gr.Column(scale=2):
            info = gr.Markdown("Click an image.", elem_id="ds-info")
            caption = gr.Textbox(label="Caption (Alt+←/→ previous/next, Ctrl+S save)", lines=4, elem_id="ds-caption")
            with gr.Row():
                prev_img = gr.Button("◀ Previous", elem_id="ds-prev")
                save = gr.Button("Save caption", variant="primary", elem_id="ds-save")
                next_img = gr.Button("Next ▶", elem_id="ds-next")
            exclude_btn = gr.Button("Exclude this image or clip (moved to .workbench/excluded)", elem_id="ds-exclude",
                                    size="sm")
            partner = gr.Gallery(label="Its duplicate / control images", columns=3, height=200, allow_preview=False,
                                 elem_id="ds-partner")
    tags_table = gr.Dataframe(headers=["tag", "images"], interactive=False, elem_id="ds-tags", max_height=260,
                              label="Tag frequency")
    timer = gr.Timer(4.0, active=False)   # thumbnails filling in; only while the page is shown

    def grid_outputs(chosen, settings_value, state_value, flag_value, tag_value, bucket_value, control_value,
                     page_no=None, ticking=False):
        if not chosen:  # nothing chosen yet: an empty grid, and the message line is left to what the user did
            return ["", "", gr.skip(), state_value, gr.skip(), gr.skip()]
        try:
            view = page.view(chosen, settings_value, control_value)
        except LibraryError as e:
            return [gr.skip(), gr.skip(), f"⚠️ {e}", state_value, gr.skip(), gr.skip()]
        indices = view.filtered(flag_value, tag_value, bucket_value)
        _, number, _ = page_of(indices, state_value.get("page", 0) if page_no is None else page_no)
        cells = grid_cells(page.cache, view.items, indices)
        key = "|".join(map(str, (view.folder, flag_value, tag_value, bucket_value, control_value)))
        html_text = grid_html(page.cache / "thumbs", cells, number, PAGE_SIZE, key)
        bucket_names, tags = view.buckets(), view.tags[:200]
        # what the grid, bucket list and tag table were drawn from: a tick that would send the same skips them
        drawn = hashlib.sha1(json.dumps([html_text, bucket_names, tags], default=str).encode()).hexdigest()
        new_state = dict(state_value, indices=indices, page=number, folder=str(view.folder), stamp=view.stamp,
                         drawn=drawn)
        if ticking and drawn == state_value.get("drawn"):   # thumbnails written, files the same: 1 MB not re-sent
            return [gr.skip(), summary_markdown(view, page.indexer.running(view.folder)), gr.skip(), new_state,
                    gr.skip(), gr.skip()]
        buckets = gr.update(choices=[("any bucket", "")] + [(b, b) for b in bucket_names])
        table = pd.DataFrame(tags, columns=["tag", "images"])
        return [html_text, summary_markdown(view, page.indexer.running(view.folder)), gr.skip(), new_state, buckets,
                table]

    grid_out = [grid, summary, message, state, bucket, tags_table]
    filters = [chooser, settings, state, flag, tag, bucket, control]

    for trigger in (chooser.change, flag.change, tag.submit, bucket.change, control.submit, refresh.click):
        trigger(lambda *args: grid_outputs(*args, page_no=0), inputs=filters, outputs=grid_out,
                show_progress="hidden", concurrency_id="ds-grid", concurrency_limit=1)

    def on_tick(*args):
        """While the page is shown: new thumbnails, files added or captions changed elsewhere appear."""
        chosen, settings_value, state_value, control_value = args[0], args[1], args[2], args[6]
        try:
            view = page.view(chosen, settings_value, control_value)
        except LibraryError:
            return [gr.skip()] * len(grid_out)
        if view.stamp == state_value.get("stamp"):
            return [gr.skip()] * len(grid_out)
        return grid_outputs(*args, ticking=True)
    timer.tick(on_tick, inputs=filters, outputs=grid_out, show_progress="hidden", concurrency_id="ds-grid")

    def show_item(chosen, settings_value, state_value, control_value, position):
        indices = state_value.get("indices", [])
        if not indices:
            return [None, "No image.", "", state_value, [], gr.update(visible=False, value=None)]
        position = min(max(0, position), len(indices) - 1)
        view = page.view(chosen, settings_value, control_value)
        item = view.items[indices[position]]
        if is_clip_name(item["path"]):   # a clip: the strip of its training windows, and the clip playing
            image, preview, text = clip_detail(page.cache, view, item)
            clip = gr.update(visible=preview is not None, value=preview)
            picture_label = "The windows the trainer takes (a row each)"
        else:
            (image, text), clip = detail_picture(view.folder, item, view.settings), gr.update(visible=False, value=None)
            picture_label = "The crop the trainer takes (red)"
        structured = readable(item.get("caption") or "")  # a JSON caption (Ideogram 4), readably
        text = f"{text}\n\n{structured}" if structured else text
        partners = [(thumb_or_placeholder(page.cache, other), grid_label(other)) for g in view.groups
                    if item["path"] in g["paths"] for other in view.items if other["path"] in g["paths"]
                    and other["path"] != item["path"]]
        partners += [(c, f"control {Path(c).name}") for c in item.get("controls", [])]
        new_state = dict(state_value, selected=position, loaded=item.get("caption"),
                         page=position // PAGE_SIZE)
        return [gr.update(value=image, label=picture_label), text, item.get("caption") or "", new_state, partners,
                clip]

    detail_out = [picture, info, caption, state, partner, player]
    detail_in = [chooser, settings, state, control]

    def on_pick(chosen, settings_value, state_value, control_value, position):
        return show_item(chosen, settings_value, state_value, control_value, int(position or 0))
    pick_go.click(on_pick, inputs=[*detail_in, pick], outputs=detail_out, show_progress="hidden")

    def step_item(step):
        def go(chosen, settings_value, state_value, control_value):
            current = state_value.get("selected")
            return show_item(chosen, settings_value, state_value, control_value,
                             0 if current is None else current + step)
        return go
    follow = "(position) => { if (window.__dsShowPosition) window.__dsShowPosition(position); }"  # the grid's page
    for button, step in ((prev_img, -1), (next_img, 1)):
        button.click(step_item(step), inputs=detail_in, outputs=detail_out, show_progress="hidden").then(
            lambda state_value: str(state_value.get("selected", "")), inputs=state, outputs=pick,
            show_progress="hidden").then(None, inputs=pick, js=follow)

    def on_save(chosen, settings_value, state_value, control_value, text):
        position = state_value.get("selected")
        if position is None:
            return "Click an image first.", state_value
        try:
            view = page.view(chosen, settings_value, control_value)
            item = view.items[state_value["indices"][position]]
            ext = CheckSettings.from_values(settings_value).caption_extension
            entry = save_caption(view.folder, item["path"], text.strip(), state_value.get("loaded"), ext)
        except (EditError, JournalError, LibraryError) as e:
            return f"⚠️ {e}", state_value
        return (f"Saved the caption of `{item['path']}`." if entry else "No change."), \
            dict(state_value, loaded=text.strip())
    save.click(on_save, inputs=[*detail_in, caption], outputs=[message, state], show_progress="hidden",
               concurrency_id="ds-edit")

    def on_exclude(chosen, settings_value, state_value, control_value, *filter_values):
        position = state_value.get("selected")
        if position is None:
            return ["Click an image first.", *[gr.skip()] * len(grid_out)]
        try:
            view = page.view(chosen, settings_value, control_value)
            rel = view.items[state_value["indices"][position]]["path"]
            exclude(view.folder, rel)
        except LibraryError as e:
            return [f"⚠️ {e}", *[gr.skip()] * len(grid_out)]
        out = grid_outputs(chosen, settings_value, dict(state_value, selected=None), *filter_values, control_value)
        out[2] = f"Excluded `{rel}` (moved to `.workbench/excluded/`; restore it from the tools below)."
        return [out[2], *out]
    exclude_btn.click(on_exclude, inputs=[*detail_in, flag, tag, bucket], outputs=[message, *grid_out],
                      show_progress="hidden", concurrency_id="ds-edit")

    # the crop is the form's: its dataset settings are read whenever the page is shown
    def on_show(payload, chosen):
        values = settings_from_form(form, payload)
        # the value stays: the user may have picked one meanwhile
        return values, gr.update(choices=page.choices(chosen)), page.table()
    refresh.click(page.table, outputs=datasets_table, show_progress="hidden")
    tab.select(on_show, inputs=[form.values, chooser], outputs=[settings, chooser, datasets_table],
               show_progress="hidden").then(
        lambda *args: grid_outputs(*args, page_no=0), inputs=filters, outputs=grid_out, show_progress="hidden",
        concurrency_id="ds-grid")

    def on_train(chosen, *current):
        try:
            folder = page.folder_of(chosen)
        except LibraryError as e:
            return [gr.skip()] * len(form.inputs) + [f"⚠️ {e}", gr.skip()]
        values = [gr.skip()] * len(form.inputs)
        for i, f in enumerate(form.fields):
            if f.dotted == "dataset.path":
                values[i] = str(folder.resolve())
        return [*values, f"The Training page's dataset.path is now `{folder}`.", gr.Tabs(selected="training")]
    ev = train.click(form.loading(on_train, at=1), inputs=[chooser, form.values],
                     outputs=[*form.inputs, message, main_tabs, form.patch], show_progress_on=message)
    form_after_load(ev)

    build_tools(page, chooser, settings, state, filters, grid_out, grid_outputs, message)
    from gui.datasets_caption import build_caption_panel
    build_caption_panel(page, chooser, settings, message, timer)
    return timer, page
