"""The complete config (TrainConfig) and introspection for the GUI and the README."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from .base import CONFIG_VERSION, F, Section
from .data_sections import Dataset, Model, Output
from .memory_sections import Memory
from .run_sections import Checkpoints, Cloud, Hardware, Logging, Webhooks
from .speed_sections import Speed
from .train_sections import Ema, Loss, Network, Optimizer, Precision, Samples, Schedule, Vae, Validation


class TrainConfig(BaseModel):
    """A complete run configuration."""
    model_config = ConfigDict(extra="forbid", validate_assignment=True)
    version: int = F(CONFIG_VERSION, "Config format version.", ge=1, resume="ignored")
    output: Output = Field(default_factory=Output)
    model: Model = Field(default_factory=Model)
    dataset: Dataset = Field(default_factory=Dataset)
    network: Network = Field(default_factory=Network)
    optimizer: Optimizer = Field(default_factory=Optimizer)
    schedule: Schedule = Field(default_factory=Schedule)
    loss: Loss = Field(default_factory=Loss)
    precision: Precision = Field(default_factory=Precision)
    memory: Memory = Field(default_factory=Memory)
    speed: Speed = Field(default_factory=Speed)
    hardware: Hardware = Field(default_factory=Hardware)
    checkpoints: Checkpoints = Field(default_factory=Checkpoints)
    cloud: Cloud = Field(default_factory=Cloud)
    webhooks: Webhooks = Field(default_factory=Webhooks)
    ema: Ema = Field(default_factory=Ema)
    samples: Samples = Field(default_factory=Samples)
    validation: Validation = Field(default_factory=Validation)
    vae: Vae = Field(default_factory=Vae)
    logging: Logging = Field(default_factory=Logging)

    @property
    def run_dir(self) -> Path:
        return Path(self.output.dir) / self.output.name


# ----------------------------------------------------------------------------- introspection

def sections() -> dict[str, type[Section]]:
    """Section name -> model class, in schema order."""
    out = {}
    for name, info in TrainConfig.model_fields.items():
        ann = info.annotation
        if isinstance(ann, type) and issubclass(ann, Section):
            out[name] = ann
    return out


def field_info(section: str, key: str) -> dict[str, Any]:
    """Type, default, bounds, choices, help and UI hint of one field (for GUI/README)."""
    info = sections()[section].model_fields[key]
    extra = info.json_schema_extra or {}
    meta: dict[str, Any] = {"section": section, "key": key, "help": info.description or "",
                            "tab": sections()[section].TAB,
                            "default": info.get_default(call_default_factory=True),
                            "ui": dict(extra.get("ui", {})), "secret": extra.get("secret", False),
                            "resume": extra.get("resume", ""),
                            "when": {**{k: list(v) for k, v in sections()[section].WHEN.items()},
                                     **extra.get("when", {})}}
    ann = info.annotation
    if getattr(ann, "__origin__", None) is Literal:
        meta["type"], meta["choices"] = "choice", list(ann.__args__)
    else:
        meta["type"] = {bool: "bool", int: "int", float: "float", str: "str"}.get(ann, "list")
    for m in info.metadata:
        for bound in ("ge", "gt", "le", "lt", "multiple_of", "pattern", "min_length"):
            if getattr(m, bound, None) is not None:
                meta[bound] = getattr(m, bound)
    return meta


def all_fields() -> list[dict[str, Any]]:
    return [field_info(s, k) for s, cls in sections().items() for k in cls.model_fields]
