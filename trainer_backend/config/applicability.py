"""Where an option applies: the `when` conditions declared on schema fields and sections
(`F(..., when={"model.arch": ("sdxl",)})`, `Section.WHEN`), evaluated on a config's values.
Pure: the studio calls it on every change to show only the options that apply; the README's
reference says the same in words."""
from __future__ import annotations

from typing import Any

# model.arch = "auto" leaves the family open: family-specific options stay visible
OPEN_VALUES = {"model.arch": "auto"}


def applies(when: dict[str, list], values: dict[str, Any]) -> bool:
    """True when every condition holds for `values` (dotted key -> current value)."""
    for key, allowed in when.items():
        value = values.get(key)
        if OPEN_VALUES.get(key) == value:
            continue
        if value not in allowed:
            return False
    return True


def describe(when: dict[str, list]) -> str:
    """'only when model.arch is sd3 or flux' (empty when the option always applies)."""
    if not when:
        return ""
    # an empty list: no registered family (yet) takes the option (dataset.control_path before an edit model)
    parts = [f"{key} is {' or '.join(str(v) for v in allowed) or '(none registered yet)'}"
             for key, allowed in when.items()]
    return "only when " + " and ".join(parts)


def values_of(cfg) -> dict[str, Any]:
    """A config's values as dotted key -> value (the keys `when` conditions name)."""
    out = {}
    for section, data in cfg.model_dump().items():
        if isinstance(data, dict):
            out.update({f"{section}.{k}": v for k, v in data.items()})
    return out
