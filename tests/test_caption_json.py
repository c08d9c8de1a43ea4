"""JSON captions (Ideogram 4's structured captions with optional boxes): a dataset with `.json` caption
files trains on the minified JSON, each bad file is one warning line naming the file and the field (and is
not trained on its broken text), and the Datasets page shows a caption readably. Pure: no model."""
from __future__ import annotations

import json

import pytest

from test_data_helpers import caption, config, write_image
from trainer_backend.data import scan_dataset
from trainer_backend.data.caption_json import CaptionSchemaError, parse_caption, readable

GOOD = {"high_level_description": "A jazz poster, flat graphic design.",
        "compositional_deconstruction": {"background": "A flat navy field.", "elements": [
            {"type": "text", "text": "JAZZ NIGHT", "desc": "Bold cream letters across the top.",
             "bbox": [0.1, 0.05, 0.9, 0.25]},
            {"type": "obj", "desc": "A gold saxophone in the center."}]}}


def test_a_json_caption_trains_as_minified_json_in_the_files_key_order():
    pretty = json.dumps(GOOD, indent=2)
    assert parse_caption(pretty) == json.dumps(GOOD, separators=(",", ":"))
    assert "\n" not in parse_caption(pretty)


@pytest.mark.parametrize("change,field", [
    (lambda d: d.pop("high_level_description"), "high_level_description"),
    (lambda d: d["compositional_deconstruction"].update(elements=[]), "compositional_deconstruction.elements"),
    (lambda d: d["compositional_deconstruction"]["elements"][0].update(type="logo"), "elements[0].type"),
    (lambda d: d["compositional_deconstruction"]["elements"][0].pop("text"), "elements[0].text"),
    (lambda d: d["compositional_deconstruction"]["elements"][0].update(bbox=[0.5, 0.1, 0.2, 0.3]), "elements[0].bbox"),
    (lambda d: d["compositional_deconstruction"]["elements"][1].update(bbox=[0, 0, 2, 1]), "elements[1].bbox"),
])
def test_a_bad_caption_names_the_field(change, field):
    data = json.loads(json.dumps(GOOD))
    change(data)
    with pytest.raises(CaptionSchemaError, match=field.replace("[", r"\[").replace("]", r"\]")):
        parse_caption(json.dumps(data))


def test_the_scan_reads_json_captions_and_warns_one_line_per_bad_file(tmp_path):
    data = tmp_path / "d"
    caption(write_image(data / "good.png", seed=1), json.dumps(GOOD, indent=2), ".json")
    caption(write_image(data / "broken.png", seed=2), '{"high_level_description": "x",', ".json")
    bad = json.loads(json.dumps(GOOD))
    bad["compositional_deconstruction"]["elements"][0]["bbox"] = [0.9, 0, 0.1, 1]
    caption(write_image(data / "box.png", seed=3), json.dumps(bad), ".json")
    scan = scan_dataset(config({"path": str(data), "caption_extension": ".json"}))
    captions = {item.path.name: item.caption for item in scan.items}
    assert captions["good.png"] == parse_caption(json.dumps(GOOD))
    assert captions["broken.png"] == "" and captions["box.png"] == ""  # never the broken text
    broken = [w for w in scan.warnings if "broken.json" in w]
    box = [w for w in scan.warnings if "box.json" in w]
    assert len(broken) == 1 and "not valid JSON (line 1" in broken[0]
    assert len(box) == 1 and "compositional_deconstruction.elements[0].bbox" in box[0]
    assert not [w for w in scan.warnings if "good.json" in w]


def test_the_datasets_page_shows_a_json_caption_readably():
    text = readable(parse_caption(json.dumps(GOOD)))
    assert text.splitlines()[0] == "**A jazz poster, flat graphic design.**"
    assert "*Background:* A flat navy field." in text
    assert "- *text “JAZZ NIGHT”* · box 0.10,0.05 → 0.90,0.25: Bold cream letters across the top." in text
    assert "- *object*: A gold saxophone in the center." in text
    assert readable("a plain caption") is None and readable('{"a": 1}') is None
