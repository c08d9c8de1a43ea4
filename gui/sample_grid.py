"""The sample grid of a run: rows = sample prompts, columns = the steps (and the strength samples of a LoRA or
checkpoint, `lora sample`), from the `sample` events. Pure where possible (grid_of, grid_html); thumbnails are
small JPEGs cached beside the samples (`samples/.thumbs/`, removed with the run's samples).

In the browser (GRID_JS): arrow keys move the selected cell, Enter or f shows it full size (Escape or a click
closes), + and − zoom the thumbnails, PageUp/PageDown (or the buttons) page through the columns. Only the page's
columns are shown and their images load lazily, so 100 steps × 10 prompts costs one page of thumbnails.
"""
from __future__ import annotations

import html
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

THUMB_PX = 192          # the longest side of a thumbnail
COLUMNS_PER_PAGE = 10
VIDEO_SUFFIXES = (".mp4", ".webm", ".mov", ".mkv", ".m4v")  # trainer_backend/data/video.py's (no import: PyAV)


@dataclass
class Grid:
    prompts: list[str] = field(default_factory=list)               # row labels
    columns: list[str] = field(default_factory=list)               # column labels ("step 400", "×0.75 …")
    cells: dict[tuple[int, int], str] = field(default_factory=dict)  # (row, column) -> image path


def column_label(ev: dict) -> str:
    if ev.get("strength") is not None:  # a `lora sample` job: which file, at which strength
        return f"{ev.get('source', 'LoRA')} ×{float(ev['strength']):g}"
    return f"step {ev.get('step', '?')}"


def grid_of(run_dir: Path, samples: list[dict]) -> Grid:
    """The grid of a run's `sample` events (in file order; a repeated column label, e.g. a resumed run's
    step sampled again, takes the newer images). Paths in events may be relative to the run."""
    grid, index = Grid(), {}
    for ev in samples:
        label = column_label(ev)
        if label not in index:
            index[label] = len(grid.columns)
            grid.columns.append(label)
        col = index[label]
        prompts = ev.get("prompts") or []
        for i, p in enumerate(ev.get("paths") or []):
            row = int(ev["rows"][i]) if isinstance(ev.get("rows"), list) and i < len(ev["rows"]) else i
            while len(grid.prompts) <= row:
                grid.prompts.append("")
            if i < len(prompts) and prompts[i] and not grid.prompts[row]:
                grid.prompts[row] = str(prompts[i])
            path = Path(p) if Path(p).is_absolute() else Path(run_dir) / p
            held = grid.cells.get((row, col))
            if held and Path(held).suffix.lower() in VIDEO_SUFFIXES and path.suffix.lower() not in VIDEO_SUFFIXES:
                continue  # a clip's cell plays the clip; its frame strip is in the gallery
            grid.cells[(row, col)] = str(path)
    return grid


def thumbnail(path: str, size: int = THUMB_PX) -> str:
    """A JPEG of at most `size` px beside the image (samples/.thumbs/), made once; the image itself when it
    is small already or cannot be read (it may be being written)."""
    src = Path(path)
    thumb = src.parent / ".thumbs" / (src.stem + ".jpg")
    try:
        if thumb.is_file() and thumb.stat().st_mtime >= src.stat().st_mtime:
            return str(thumb)
        from PIL import Image
        with Image.open(src) as im:
            if max(im.size) <= size:
                return path
            im.thumbnail((size, size))
            thumb.parent.mkdir(exist_ok=True)
            tmp = thumb.with_suffix(".partial")
            im.convert("RGB").save(tmp, format="JPEG", quality=85)
            tmp.replace(thumb)
        return str(thumb)
    except OSError:
        return path


def file_url(path: str) -> str:
    """Gradio's URL for a file under the allowed paths (relative, so a --root-path mount works too)."""
    return "gradio_api/file=" + quote(str(Path(path).resolve()))


def grid_html(grid: Grid, title: str = "", thumbs: bool = True, per_page: int = COLUMNS_PER_PAGE) -> str:
    """The grid as HTML for GRID_JS: a table with one row per prompt, one column per step; the last page
    (the newest steps) shown first."""
    if not grid.columns:
        return "<div class='sample-grid empty'>No samples yet (samples.prompts with samples.every_n_steps, " \
               "or Sample now).</div>"
    pages = (len(grid.columns) + per_page - 1) // per_page
    head = "".join(f"<th data-col='{c}' data-page='{c // per_page}'>{html.escape(label)}</th>"
                   for c, label in enumerate(grid.columns))
    rows = []
    for r, prompt in enumerate(grid.prompts):
        cells = []
        for c in range(len(grid.columns)):
            path = grid.cells.get((r, c))
            if path is None:
                cells.append(f"<td data-col='{c}' data-page='{c // per_page}' class='missing'></td>")
                continue
            tip = html.escape(f"{grid.columns[c]} · {prompt}")
            if Path(path).suffix.lower() in VIDEO_SUFFIXES:  # a video family's clip plays in its cell
                cells.append(f"<td data-col='{c}' data-page='{c // per_page}' data-row='{r}' tabindex='-1' "
                             f"title='{tip}'><video muted loop controls preload='none' "
                             f"data-src='{html.escape(file_url(path))}'></video></td>")
                continue
            shown = thumbnail(path) if thumbs else path
            cells.append(f"<td data-col='{c}' data-page='{c // per_page}' data-row='{r}' tabindex='-1' "
                         f"data-full='{html.escape(file_url(path))}' title='{tip}'>"
                         f"<img loading='lazy' alt='{tip}' data-src='{html.escape(file_url(shown))}'></td>")
        rows.append(f"<tr><th class='prompt' title='{html.escape(prompt)}'>{html.escape(prompt or f'prompt {r + 1}')}"
                    f"</th>{''.join(cells)}</tr>")
    return (f"<div class='sample-grid' tabindex='0' data-pages='{pages}' data-page='{pages - 1}'>"
            f"<div class='grid-bar'><b>{html.escape(title)}</b> <button class='grid-prev'>◀</button> "
            f"<span class='grid-page'></span> <button class='grid-next'>▶</button> "
            f"<button class='grid-zoom-out'>−</button><button class='grid-zoom-in'>+</button> "
            f"<span class='grid-help'>{len(grid.prompts)} prompts × {len(grid.columns)} columns · arrows move, "
            f"Enter/f full size, +/− zoom, PgUp/PgDn page</span></div>"
            f"<table><thead><tr><th></th>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"
            f"<div class='grid-full' hidden><img alt='full size'></div></div>")


# event delegation on the component's element: it survives every re-render of the grid's HTML
GRID_JS = """
const state = {zoom: 1};
function grid() { return element.querySelector('.sample-grid'); }
function show(page) {
  const g = grid(); if (!g || !g.dataset.pages) return;
  const pages = +g.dataset.pages; page = Math.max(0, Math.min(pages - 1, page)); g.dataset.page = page;
  g.querySelectorAll('[data-page]').forEach(c => { c.style.display = (+c.dataset.page === page) ? '' : 'none'; });
  g.querySelectorAll(`td[data-page="${page}"] [data-src]`).forEach(i => { if (!i.src) i.src = i.dataset.src; });
  // only when it changes: the text is a child node, and the observer below re-runs show() on child changes
  const label = g.querySelector('.grid-page'), text = `page ${page + 1} / ${pages}`;
  if (label && label.textContent !== text) label.textContent = text;
  g.style.setProperty('--thumb', `${Math.round(96 * state.zoom)}px`);
}
function select(td) {
  const g = grid(); if (!g || !td) return;
  g.querySelectorAll('td.selected').forEach(c => c.classList.remove('selected'));
  td.classList.add('selected'); if (+td.dataset.page !== +g.dataset.page) show(+td.dataset.page);
  td.scrollIntoView({block: 'nearest', inline: 'nearest'});
}
function full(open) {
  const g = grid(); if (!g) return; const box = g.querySelector('.grid-full'); const td = g.querySelector('td.selected');
  if (open && td && td.dataset.full) { box.querySelector('img').src = td.dataset.full; box.hidden = false; }
  else { box.hidden = true; }
}
function move(dr, dc) {
  const g = grid(); if (!g) return; const td = g.querySelector('td.selected');
  if (!td) { select(g.querySelector(`td[data-row][data-page="${g.dataset.page}"]`)); return; }
  const r = +td.dataset.row + dr, c = +td.dataset.col + dc;
  const next = g.querySelector(`td[data-row="${r}"][data-col="${c}"]`); if (next) select(next);
}
new MutationObserver(() => show(+((grid() || {dataset: {}}).dataset.page || 0))).observe(element, {childList: true, subtree: true});
element.addEventListener('click', e => {
  const g = grid(); if (!g) return;
  if (e.target.closest('.grid-full')) { full(false); return; }
  if (e.target.closest('.grid-prev')) { show(+g.dataset.page - 1); return; }
  if (e.target.closest('.grid-next')) { show(+g.dataset.page + 1); return; }
  if (e.target.closest('.grid-zoom-in')) { state.zoom = Math.min(4, state.zoom * 1.25); show(+g.dataset.page); return; }
  if (e.target.closest('.grid-zoom-out')) { state.zoom = Math.max(0.5, state.zoom / 1.25); show(+g.dataset.page); return; }
  const td = e.target.closest('td[data-row]'); if (td) { select(td); g.focus(); full(true); }
});
element.addEventListener('keydown', e => {
  const g = grid(); if (!g) return;
  const keys = {ArrowUp: [-1, 0], ArrowDown: [1, 0], ArrowLeft: [0, -1], ArrowRight: [0, 1]};
  if (keys[e.key]) { move(...keys[e.key]); e.preventDefault(); }
  else if (e.key === 'Enter' || e.key === 'f') { full(g.querySelector('.grid-full').hidden); e.preventDefault(); }
  else if (e.key === 'Escape') { full(false); }
  else if (e.key === '+' || e.key === '=') { state.zoom = Math.min(4, state.zoom * 1.25); show(+g.dataset.page); }
  else if (e.key === '-') { state.zoom = Math.max(0.5, state.zoom / 1.25); show(+g.dataset.page); }
  else if (e.key === 'PageDown') { show(+g.dataset.page + 1); e.preventDefault(); }
  else if (e.key === 'PageUp') { show(+g.dataset.page - 1); e.preventDefault(); }
});
show(+((grid() || {dataset: {}}).dataset.page || 0));
"""

GRID_CSS = """
.sample-grid { --thumb: 96px; overflow-x: auto; outline: none; position: relative; }
.sample-grid table { border-collapse: collapse; }
.sample-grid th { font-weight: 600; font-size: .85em; padding: 2px 6px; white-space: nowrap; }
.sample-grid th.prompt { max-width: 16em; overflow: hidden; text-overflow: ellipsis; text-align: left; }
.sample-grid td { padding: 2px; cursor: zoom-in; }
.sample-grid td img, .sample-grid td video { width: var(--thumb); height: var(--thumb); object-fit: contain; display: block; }
.sample-grid td.selected { outline: 3px solid var(--color-accent); }
.sample-grid .grid-bar { margin-bottom: 4px; display: flex; gap: 6px; align-items: center; flex-wrap: wrap; }
.sample-grid .grid-help { opacity: .7; font-size: .85em; }
.sample-grid .grid-full { position: fixed; inset: 0; background: rgba(0,0,0,.85); z-index: 1000;
  display: flex; align-items: center; justify-content: center; cursor: zoom-out; }
.sample-grid .grid-full[hidden] { display: none; }
.sample-grid .grid-full img { max-width: 95vw; max-height: 95vh; image-rendering: pixelated; }
"""
