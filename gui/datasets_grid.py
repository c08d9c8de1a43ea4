"""The Datasets page's thumbnail grid, paged in the browser: the server sends the filtered view's
thumbnails once (names and labels as JSON inside the grid's HTML, when the dataset, a filter or
the index changes) and a small script draws the page; "◀ Page"/"Page ▶" only redraw, with no server
round trip (a queued Gradio event per page change cost 0.38-0.45 s at 10,000 images,
docs/dataset.md). The next page's thumbnails are fetched ahead. A click on a thumbnail sends its
position in the filtered list to the server through a hidden box and button (#ds-pick). When the
detail view steps to another image (◀ Previous / Next ▶, Alt+←/→), the grid turns to that image's
page and marks it (`window.__dsShowPosition`, called after the step)."""
from __future__ import annotations

import html
import json
from pathlib import Path
from urllib.parse import quote

from trainer_backend.workbench.clips import clip_label
from trainer_backend.workbench.index import thumb_name

from gui.datasets_model import FLAG_LABELS, placeholder

GRID_CSS = """
#ds-grid .ds-pager { display: flex; align-items: center; gap: 12px; margin: 4px 0; }
#ds-grid .ds-page-btn { padding: 4px 12px; border: 1px solid var(--border-color-primary); border-radius: 6px; }
#ds-grid .ds-cells { display: grid; grid-template-columns: repeat(10, minmax(0, 1fr)); gap: 6px; max-height: 420px;
                     overflow-y: auto; }
#ds-grid .ds-cell { margin: 0; cursor: pointer; border: 2px solid transparent; border-radius: 4px; }
#ds-grid .ds-cell.selected { border-color: var(--color-accent); }
#ds-grid .ds-cell img { width: 100%; aspect-ratio: 1; object-fit: contain; background: #eee; }
#ds-grid .ds-cell figcaption { font-size: 11px; overflow: hidden; white-space: nowrap; text-overflow: ellipsis; }
"""

GRID_JS = """() => { if (window.__datasetGrid) return; window.__datasetGrid = true;
  const style = document.createElement('style');
  style.textContent = %s;
  document.head.appendChild(style);
  const state = {json: null, key: null, page: 0, selected: null};
  const render = (root) => {
    const data = JSON.parse(state.json);
    const pages = Math.max(1, Math.ceil(data.items.length / data.size));
    state.page = Math.min(Math.max(0, state.page), pages - 1);
    let view = root.querySelector('.ds-grid-view');
    if (!view) { view = document.createElement('div'); view.className = 'ds-grid-view'; root.appendChild(view); }
    const start = state.page * data.size, shown = data.items.slice(start, start + data.size);
    const mark = (k) => start + k === state.selected ? ' selected' : '';
    const cell = ([thumb, label], k) => `<figure class="ds-cell${mark(k)}" data-pos="${start + k}" title="${label}">` +
      `<img src="${data.base}${thumb}" alt="${label}" draggable="false" loading="${k < 30 ? 'eager' : 'lazy'}" ` +
      `onerror="if (!this.dataset.missing) { this.dataset.missing = 1; this.src = '${data.base}${data.missing}'; }"><figcaption>${label}</figcaption></figure>`;
    view.innerHTML = `<div class="ds-pager"><button class="ds-page-btn" id="ds-page-prev">◀ Page</button>` +
      `<span id="ds-page-label">page ${state.page + 1} of ${pages} (${data.items.length} shown, ${data.size} a page)` +
      `</span><button class="ds-page-btn" id="ds-page-next">Page ▶</button></div>` +
      `<div class="ds-cells">${shown.map(cell).join('')}</div>`;
    // the next page's first rows are fetched ahead, once this page's first rows are in (they would
    // compete); the rows below the scroll box load when scrolled to
    const after = data.items.slice(start + data.size, start + data.size + 30);
    const loaded = [...view.querySelectorAll('img')].slice(0, 30).map((img) => img.complete ? null :
      new Promise((done) => { img.addEventListener('load', done); img.addEventListener('error', done); }));
    Promise.all(loaded).then(() => {
      window.__dsAhead = after.map(([thumb]) => { const i = new Image(); i.src = data.base + thumb; return i; });
    });
  };
  const check = () => {
    const root = document.querySelector('#ds-grid');
    const holder = root && root.querySelector('.ds-grid-data');
    if (!holder) return;
    const json = holder.getAttribute('data-json');
    if (json === state.json && root.querySelector('.ds-grid-view')) return;
    const data = JSON.parse(json);
    if (data.key !== state.key) { state.page = data.page; state.selected = null; }  // another dataset or filter
    state.json = json; state.key = data.key;
    render(root);
  };
  window.__dsShowPosition = (position) => {   // the detail view moved: follow it to its page
    const root = document.querySelector('#ds-grid');
    const pos = parseInt(position, 10);
    if (!root || !state.json || Number.isNaN(pos)) return;
    state.selected = pos;
    state.page = Math.floor(pos / JSON.parse(state.json).size);
    render(root);
  };
  new MutationObserver(check).observe(document.body, {childList: true, subtree: true, attributes: true,
                                                      attributeFilter: ['data-json']});
  document.addEventListener('click', (e) => {
    const root = document.querySelector('#ds-grid');
    if (!root || !root.contains(e.target) || !state.json) return;
    if (e.target.closest('#ds-page-prev')) { state.page -= 1; render(root); return; }
    if (e.target.closest('#ds-page-next')) { state.page += 1; render(root); return; }
    const fig = e.target.closest('.ds-cell');
    if (!fig) return;
    root.querySelectorAll('.ds-cell.selected').forEach((c) => c.classList.remove('selected'));
    fig.classList.add('selected');
    state.selected = parseInt(fig.getAttribute('data-pos'), 10);
    const box = document.querySelector('#ds-pick textarea, #ds-pick input');
    box.value = fig.getAttribute('data-pos');
    box.dispatchEvent(new Event('input', {bubbles: true}));
    document.querySelector('#ds-pick-go').click();
  });
}""" % json.dumps(GRID_CSS)



def grid_cells(cache: Path, items: list[dict], indices: list[int]) -> list[tuple[str, str]]:
    """(thumbnail name under the cache's thumbs/ folder, label) of the items at `indices`. An image
    or clip indexed has its thumbnail (a missing one shows the placeholder in the browser: the script's
    onerror), so no file is looked at: 10,000 cells in tens of ms."""
    pending, unreadable = (placeholder(cache, kind).name for kind in ("pending", "unreadable"))
    out = []
    for i in indices:
        item = items[i]
        sha = item.get("sha256")
        thumb = thumb_name(sha) if sha else unreadable if "unreadable" in item["flags"] else pending
        name = clip_label(item["path"].rsplit("/", 1)[-1], item)   # a clip: 'walk.mp4 ▶ 2.4 s, 38 f'
        marks = ", ".join(FLAG_LABELS[k] for k in item["flags"] if k in FLAG_LABELS)
        out.append((thumb, f"{name} ⚠ {marks}" if marks else name))
    return out


def grid_html(thumbs_dir: Path, cells: list[tuple[str, str]], page: int, size: int, key: str) -> str:
    """The grid's HTML: the data the script draws from. `cells` are (thumbnail name under
    `thumbs_dir`, label) of every filtered image, in order."""
    items = [[quote(thumb), html.escape(label)] for thumb, label in cells]   # written into HTML as they are
    data = {"base": f"gradio_api/file={quote(str(thumbs_dir))}/", "items": items, "page": page, "size": size,
            "key": key, "missing": "placeholder-pending.png"}
    # a single-quoted attribute: JSON's many double quotes stay one byte each (1.3 MB at 10,000 images)
    text = html.escape(json.dumps(data, ensure_ascii=False, separators=(",", ":")), quote=False).replace("'", "&#x27;")
    return f"<div class='ds-grid-data' hidden data-json='{text}'></div>"
