"""The grid's data (gui/datasets_grid.py): every filtered image's thumbnail name and label, escaped
for the HTML the browser's script writes them into."""
import html
import json
import re

from gui.datasets_grid import grid_cells, grid_html
from trainer_backend.workbench import thumb_path


def _data(markup: str) -> dict:
    return json.loads(html.unescape(re.search(r"data-json='([^']*)'", markup).group(1)))


def test_grid_data_names_thumbnails_under_the_served_folder_and_escapes_labels(tmp_path):
    cache = tmp_path / "cache dir"
    items = [{"path": "sub/cat.png", "flags": {}, "sha256": "ab12" * 16},
             {"path": 'x<img src=y onerror="alert(1)">.png', "flags": {"too_small": "64 px"}, "pending": True},
             {"path": "bad.png", "flags": {"unreadable": "truncated"}}]
    cells = grid_cells(cache, items, [0, 1, 2])
    assert (cache / "thumbs" / cells[0][0]) == thumb_path(cache, "ab12" * 16)
    assert cells[0][1] == "cat.png" and cells[1][1].endswith("⚠ too small")
    assert (cache / "thumbs" / cells[1][0]).is_file() and (cache / "thumbs" / cells[2][0]).is_file()  # placeholders
    assert cells[1][0] != cells[2][0]

    markup = grid_html(cache / "thumbs", cells, 3, 60, "dogs|")
    assert markup.count("<") == 2   # one element: no label reaches the markup as a tag
    data = _data(markup)
    assert data["base"] == "gradio_api/file=" + str(cache / "thumbs").replace(" ", "%20") + "/"
    assert data["items"][0][0] == cells[0][0] and "<" not in data["items"][1][1]
    assert html.unescape(data["items"][1][1]) == cells[1][1]
    assert (data["page"], data["size"], data["key"]) == (3, 60, "dogs|")
