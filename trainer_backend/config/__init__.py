"""The one schema: every option is defined here once.

The GUI tabs, the CLI `--set` overrides, presets (sparse TOML), the README's config
reference and validation messages are all derived from these models. Adding an option
means adding one field here plus the code that uses it.

Conventions: no optional (None) values, because TOML has no null; "" or 0 mean "off".
Each field carries `help` text and a `ui` hint (widget, advanced) in json_schema_extra.

The package: base.py (field helper), *_sections.py (the sections), schema.py (TrainConfig,
introspection), io.py (load/save/validate/overrides). Everything is importable from here."""
from .base import CONFIG_VERSION, ConfigError, F, Section
from .data_sections import Dataset, DatasetSubset, Model, Output
from .io import (MIGRATIONS, apply_overrides, check_unknown_keys, dumps_toml, from_dict, load_config, load_toml,
                 migrate, parse_override, save_toml, sparse_dict, strip_secrets, to_dict)
from .run_sections import Checkpoints, Cloud, Hardware, Logging, WebhookTarget, Webhooks
from .schema import TrainConfig, all_fields, field_info, sections
from .train_sections import Ema, Loss, Network, Optimizer, Precision, Samples, Schedule, Vae, Validation

__all__ = [
    "CONFIG_VERSION", "ConfigError", "F", "Section", "Output", "Model", "DatasetSubset", "Dataset", "Network",
    "Optimizer", "Schedule", "Loss", "Precision", "Ema", "Samples", "Validation", "Vae", "Hardware",
    "Checkpoints", "Cloud", "WebhookTarget", "Webhooks", "Logging", "TrainConfig", "sections", "field_info",
    "all_fields", "MIGRATIONS", "migrate", "check_unknown_keys", "from_dict", "to_dict", "sparse_dict",
    "strip_secrets", "load_toml", "dumps_toml", "save_toml", "parse_override", "apply_overrides", "load_config",
]
