"""Structured JSON captions (`.json` caption files, as Ideogram 4 is trained on them): checked against the
caption schema of Ideogram4Pipeline's prompt enhancer, with an optional bounding box per element, and
given to the text encoder as the minified one-line JSON the pipeline's prompt upsampling writes.
Pure (stdlib only): the data scan, the workbench checks and the Datasets page use it.

    {"high_level_description": "...",
     "compositional_deconstruction": {"background": "...", "elements": [
         {"type": "obj", "desc": "...", "bbox": [x0, y0, x1, y1]},
         {"type": "text", "text": "VERBATIM", "desc": "..."}]}}

`bbox` (optional) is the element's box as fractions of the image's width and height (0..1, x0 < x1,
y0 < y1); diffusers' schema has no boxes, so a caption with them passes to the text encoder as written.
"""
from __future__ import annotations

import json

JSON_EXTENSION = ".json"
ELEMENT_TYPES = ("obj", "text")


class CaptionSchemaError(ValueError):
    """One line: where in the caption (a JSON path) and what is wrong."""


def _text(value, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise CaptionSchemaError(f"{where}: expected a non-empty string")
    return value


def _bbox(value, where: str) -> None:
    ok = (isinstance(value, list) and len(value) == 4
          and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value))
    if not ok or not (0 <= value[0] < value[2] <= 1 and 0 <= value[1] < value[3] <= 1):
        raise CaptionSchemaError(f"{where}: expected [x0, y0, x1, y1] as fractions 0..1 with x0 < x1 and "
                                 f"y0 < y1, got {json.dumps(value)[:60]}")


def check_caption(data) -> None:
    """Raise CaptionSchemaError naming the first field that does not fit the schema."""
    if not isinstance(data, dict):
        raise CaptionSchemaError("expected a JSON object with high_level_description and compositional_deconstruction")
    _text(data.get("high_level_description"), "high_level_description")
    comp = data.get("compositional_deconstruction")
    if not isinstance(comp, dict):
        raise CaptionSchemaError("compositional_deconstruction: expected an object with background and elements")
    _text(comp.get("background"), "compositional_deconstruction.background")
    elements = comp.get("elements")
    if not isinstance(elements, list) or not elements:
        raise CaptionSchemaError("compositional_deconstruction.elements: expected a non-empty list")
    for i, element in enumerate(elements):
        where = f"compositional_deconstruction.elements[{i}]"
        if not isinstance(element, dict):
            raise CaptionSchemaError(f"{where}: expected an object")
        if element.get("type") not in ELEMENT_TYPES:
            raise CaptionSchemaError(f"{where}.type: expected \"obj\" or \"text\", got {json.dumps(element.get('type'))}")
        _text(element.get("desc"), f"{where}.desc")
        if element["type"] == "text":
            _text(element.get("text"), f"{where}.text")
        if "bbox" in element:
            _bbox(element["bbox"], f"{where}.bbox")


def parse_caption(text: str) -> str:
    """A JSON caption file's text -> the minified caption (keys in the file's order); CaptionSchemaError
    (one line: JSON syntax with line and column, or the schema field) otherwise."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise CaptionSchemaError(f"not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})") from None
    check_caption(data)
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"))


def readable(caption: str) -> str | None:
    """A JSON caption as a few lines a person reads (markdown); None when `caption` is not one."""
    text = caption.strip()
    if not text.startswith("{"):
        return None
    try:
        data = json.loads(text)
        check_caption(data)
    except (json.JSONDecodeError, CaptionSchemaError):
        return None
    comp = data["compositional_deconstruction"]
    lines = [f"**{data['high_level_description']}**", "", f"*Background:* {comp['background']}", ""]
    for element in comp["elements"]:
        box = element.get("bbox")
        where = f" · box {box[0]:.2f},{box[1]:.2f} → {box[2]:.2f},{box[3]:.2f}" if box else ""
        label = f"text “{element['text']}”" if element["type"] == "text" else "object"
        lines.append(f"- *{label}*{where}: {element['desc']}")
    return "\n".join(lines)
