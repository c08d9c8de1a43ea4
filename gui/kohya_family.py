"""A kohya_ss import for a family chosen in the studio (kohya_ss has no key for Krea 2, Qwen-Image 2.1,
Ideogram 4, ...): model.arch is the chosen family, and each key the file sets that means nothing for it is
taken out of the import and reported (KohyaImport.ignored) with the reason (gui/kohya_keys.py's tables)."""
from __future__ import annotations

from typing import Any

from gui.kohya_keys import CHOSEN_FAMILY_IGNORED, _int, _off


def chosen_family(src: dict, b, family: str) -> None:
    """The family chosen in the studio (kohya_ss has no key for it) wins over the file's: model.arch, and
    the keys that mean nothing for it taken out of the import, each reported with the reason."""
    from trainer_backend.families.registry import entry
    label = entry(family).label
    b.put("(the family chosen for this import)", "model.arch", family)
    for key, why in CHOSEN_FAMILY_IGNORED.get(family, {}).items():
        if not _set_for(key, src.get(key)):
            continue
        for kohya, dotted, _ in [m for m in b.result.mapped if key in m[0].split("/")]:
            section, name = dotted.split(".", 1)
            b.result.data.get(section, {}).pop(name, None)
            if section in b.result.data and not b.result.data[section]:
                del b.result.data[section]
            b.result.mapped = [m for m in b.result.mapped if m[1] != dotted]
        b.result.unsupported = [u for u in b.result.unsupported if u[0] != key]
        b.result.notes = [n for n in b.result.notes if not n.startswith(f"{key} ")]
        b.result.ignored.append((key, src[key], why.format(label=label)))


def _set_for(key: str, value: Any) -> bool:
    """The file sets `key` to something that would act (clip_skip: above 1, kohya's "not set")."""
    if _off(value):
        return False
    if key == "clip_skip":
        try:
            return _int(value) > 1
        except ValueError:
            return True
    return True
