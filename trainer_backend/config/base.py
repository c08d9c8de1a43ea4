"""Building blocks of the schema: the field helper, the section base, the error type."""
from __future__ import annotations

from typing import Any, ClassVar, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from ..errors import ConfigError  # noqa: F401  (re-exported: the schema's error type)
from ..file_limits import path_text_problem

CONFIG_VERSION = 1


class Problem(NamedTuple):
    """One thing wrong with a config: the dotted key it is about and what is wrong (config/rules.py).
    `str()` is the one-line form every message has: "network.dora: DoRA is a LoRA option; …"."""
    key: str
    message: str

    def __str__(self) -> str:
        return f"{self.key}: {self.message}"

    def error(self) -> ConfigError:
        return ConfigError(str(self))


# Why a changed option cannot continue a checkpoint (resume="unsafe:<reason>").
RESUME_REASONS = {
    "arch": "the trained weights belong to another architecture",
    "prediction": "the UNet was trained to predict something else",
    "network": "the checkpoint holds another kind of network",
    "shape": "the adapter weights in the checkpoint have another shape",
    "scale": "the adapter weights were trained with another scale",
    "modules": "the checkpoint has adapters on other modules",
    "adapters": "the checkpoint's adapters were built with another value: new ones would silently start from scratch",
    "optimizer": "the optimizer state in the checkpoint belongs to another optimizer",
    "batch": "the position inside the epoch is counted in batches of the old size",
    "order": "the data order and noise of the rest of the epoch would change",
    "buckets": "images would be batched differently (the position inside the epoch is lost)",
    "samples": "each epoch would hold other samples (the position inside the epoch is lost)",
}
RESUME_KINDS = ("safe", "ignored", "unsafe", "unsafe_if_bucketing")


def F(default: Any, help: str, *, resume: str, widget: str = "", advanced: bool = False,
      secret: bool = False, when: dict[str, tuple] | None = None, **bounds: Any) -> Any:
    """A schema field: default, help text, UI hint, pydantic bounds (ge, le, ...), and what changing it
    means for a resumed run (run/resume.py): "safe" (allowed and logged), "ignored" (where things live or
    are reported), "unsafe:<reason>" (refused; RESUME_REASONS), "unsafe_if_bucketing:<reason>".
    when: where the option applies, {"section.key": (values…)} (all must hold; config/applicability.py);
    the studio shows it only there and the README says so."""
    kind, _, reason = resume.partition(":")
    if kind not in RESUME_KINDS or (kind.startswith("unsafe") and reason not in RESUME_REASONS):
        raise ValueError(f"resume={resume!r}: expected one of {RESUME_KINDS}, unsafe ones with a reason from "
                         f"RESUME_REASONS")
    extra = {"ui": {"widget": widget, "advanced": advanced}, "secret": secret, "resume": resume,
             "when": {k: list(v) for k, v in (when or {}).items()}}
    return Field(default, description=help, json_schema_extra=extra, **bounds)


class Section(BaseModel):
    """One [table] of the config. TAB names the GUI tab that shows it."""
    # nan and inf are never a setting: refused naming the key, not mistaken for a bound ("must be ≤ 10")
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)
    TAB: ClassVar[str] = "Other"
    WHEN: ClassVar[dict[str, tuple]] = {}  # where the whole section applies (as F's `when`)

    @field_validator("*")
    @classmethod
    def _usable_path(cls, value: Any, info: ValidationInfo) -> Any:
        """Every path option (widget "path") holds text the system can open: no NUL, within its length
        limits (file_limits.py); otherwise one line naming the key, never an OSError later."""
        extra = cls.model_fields[info.field_name].json_schema_extra if info.field_name else None
        is_path = isinstance(extra, dict) and extra.get("ui", {}).get("widget") == "path"
        for item in value if isinstance(value, list) else [value]:
            if not isinstance(item, str):
                continue
            if is_path and (problem := path_text_problem(item)):
                raise ValueError(f"the path {problem}")
            if "\x00" in item:  # no setting holds one (a path given where no widget says so, a prompt)
                raise ValueError("contains a NUL character (\\x00), which no setting can hold")
        return value
