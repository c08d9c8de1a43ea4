"""Building blocks of the schema: the field helper, the section base, the error type."""
from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from ..errors import ConfigError  # noqa: F401  (re-exported: the schema's error type)

CONFIG_VERSION = 1


def F(default: Any, help: str, *, widget: str = "", advanced: bool = False,
      secret: bool = False, **bounds: Any) -> Any:
    """A schema field: default, help text, UI hint, and pydantic bounds (ge, le, ...)."""
    extra = {"ui": {"widget": widget, "advanced": advanced}, "secret": secret}
    return Field(default, description=help, json_schema_extra=extra, **bounds)


class Section(BaseModel):
    """One [table] of the config. TAB names the GUI tab that shows it."""
    model_config = ConfigDict(extra="forbid", validate_assignment=True)
    TAB: ClassVar[str] = "Other"
