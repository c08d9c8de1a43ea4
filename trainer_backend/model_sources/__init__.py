"""Model sources: hub repo ids (`org/name[@revision]`, `org/name/file.safetensors`) in model fields,
downloaded into the standard Hugging Face cache with progress, resumable, one process at a time
(docs/models.md, "From the Hugging Face hub"). The public face; the rest of the backend imports only this.

    resolve_model("org/name", progress=printer())            -> local snapshot folder
    resolve_model("org/name", allow_patterns=["*.json", "*.safetensors"])   (a captioner: its own files)
    resolve_config_models(cfg, emit=run.events.emit)          -> cfg with local paths in its model fields
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from ..errors import ConfigError
from .progress import DownloadStatus, Progress, human_bytes, printer, status_line, to_events
from .spec import HubSpec, parse_hub_spec

__all__ = ["HubSpec", "parse_hub_spec", "hub_spec", "resolve_model", "plan_model", "DownloadStatus", "Progress",
           "printer", "to_events", "status_line", "human_bytes", "resolve_config_models", "config_hub_fields",
           "hub_problems", "plan_lines", "fetch_before_training", "KINDS"]

KINDS = ("model", "files", "tokenizer")  # what a field needs: a model (the family picks), a repo's files, tokenizers


def hub_spec(value: str) -> HubSpec | None:
    """The hub repo a field's value names; None for local paths (an existing path always wins), builtin: and ""."""
    from ..config.paths import resolve_path
    spec = parse_hub_spec(value)
    if spec is None or Path(resolve_path(value)).expanduser().exists():
        return None
    return spec


def _selector(spec: HubSpec, kind: str, allow_patterns: list[str] | None):
    from ..families.hub_files import plain_files, tokenizer_files

    def select(names: list[str], fetch: Callable[[list[str]], Path]) -> tuple[list[str], str]:
        if spec.filename:
            return [spec.filename], ""
        if allow_patterns is not None:
            from huggingface_hub.utils import filter_repo_objects
            return sorted(filter_repo_objects(names, allow_patterns=allow_patterns)), ""
        if kind == "tokenizer":
            return tokenizer_files(names), ""
        if kind == "model" and "model_index.json" in names:
            from ..families import repo_files
            probes = [n for n in names if n == "model_index.json" or (n.count("/") == 1 and n.endswith("/config.json"))]
            return repo_files(fetch(probes), names)
        return plain_files(names), ""
    selection = f"{kind}|{spec.filename}|{sorted(allow_patterns) if allow_patterns is not None else ''}"
    return select, selection


def _settings(offline: bool):
    from .hub import HubSettings
    return HubSettings.from_env(offline=offline)


def resolve_model(spec: str | HubSpec, allow_patterns: list[str] | None = None, progress: Progress | None = None,
                  *, key: str = "model.path", token: str | None = None, kind: str = "model",
                  offline: bool = False) -> Path:
    """A local path for a hub repo (its snapshot folder) or one file of it (`org/name/file.safetensors`):
    from the cache when an earlier download completed (no network), else downloaded now. `allow_patterns`
    (fnmatch, as huggingface_hub's) replaces the family's choice of files; `progress` receives
    DownloadStatus records; `token` is for gated/private repos (never logged). Errors: ConfigError, one line
    naming `key` and the repo. `offline` (or HF_HUB_OFFLINE=1): the cache only."""
    from .hub import fetch
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}")
    parsed = parse_hub_spec(spec) if isinstance(spec, str) else spec
    if parsed is None:
        raise ConfigError(f"{key}: {spec!r} is not a hub repo id (org/name, org/name@revision or "
                          "org/name/file.safetensors)")
    select, selection = _selector(parsed, kind, allow_patterns)
    folder = fetch(parsed, select, selection, key=key, token=token, progress=progress or (lambda status: None),
                   settings=_settings(offline))
    return folder / parsed.filename if parsed.filename else folder


def plan_model(spec: HubSpec, *, key: str = "model.path", token: str | None = None, kind: str = "model",
               allow_patterns: list[str] | None = None):
    """What resolve_model would download (a DownloadPlan: files, sizes, free space); fetches only the
    repo's listing and, for a pipeline, its small model_index.json and config files."""
    from .hub import make_plan
    from .messages import describe
    select, _ = _selector(spec, kind, allow_patterns)
    settings = _settings(False)
    try:
        return make_plan(spec, settings, token, select, key)
    except ConfigError:
        raise
    except Exception as e:
        raise ConfigError(describe(e, spec, key, settings.endpoint)) from e


from .config_models import (config_hub_fields, fetch_before_training, hub_problems, plan_lines,  # noqa: E402
                            resolve_config_models)
