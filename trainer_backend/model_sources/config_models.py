"""A config's model fields that name hub repos: the checks before a run, the plan's download lines, and
their resolution to local paths before the model loads (the trainer's main process first)."""
from __future__ import annotations

from typing import Callable, Iterator

from ..errors import ConfigError
from .spec import HubSpec

# what each field needs from a repo; every other path field of [model] (vae, clip_l, t5, text_encoder…)
# takes the repo's files as they are (one weight variant per folder) or one named file
FIELD_KINDS = {"path": "model", "tokenizer": "tokenizer"}


def _path_fields(section) -> list[str]:
    """The [model] fields holding a folder or file (the schema's path widget): derived, never listed."""
    return [name for name, info in type(section).model_fields.items()
            if ((info.json_schema_extra or {}).get("ui") or {}).get("widget") == "path"]


def config_hub_fields(cfg) -> list[tuple[str, str, HubSpec]]:
    """(config key, field name, spec) of every [model] path field whose value is a hub repo id."""
    from . import hub_spec
    found = []
    for name in _path_fields(cfg.model):
        spec = hub_spec(getattr(cfg.model, name) or "")
        if spec is not None:
            found.append((f"model.{name}", name, spec))
    return found


def _offline(cfg) -> bool:
    return not getattr(cfg.model, "hub_download", True)


def hub_token(cfg) -> str | None:
    """The token for gated/private repos, from the secret model.hub_token_name names (environment, then
    cloud.secrets_file); registered with the log filter that masks secrets."""
    from ..remote.secrets import Secrets, mask_in_logs
    name = getattr(cfg.model, "hub_token_name", "") or ""
    if not name:
        return None
    token = Secrets.from_config(cfg).get(name)
    if token:
        mask_in_logs({token})
    return token


def hub_problems(cfg) -> Iterator[tuple[str, str]]:
    """(key, message) for hub ids that cannot work without the network while downloads are off."""
    from .hub import HubSettings, cached_snapshot
    from . import _selector
    settings = HubSettings.from_env(offline=_offline(cfg))
    if not settings.offline:
        return
    for key, name, spec in config_hub_fields(cfg):
        _, selection = _selector(spec, FIELD_KINDS.get(name, "files"), None)
        if cached_snapshot(settings, spec, selection) is None:
            from .messages import offline_message
            yield key, offline_message(spec, key).split(": ", 1)[1]


def resolve_config_models(cfg, emit: Callable[..., None] | None = None, show: bool = True, extra=None,
                          apply: bool = True):
    """Every hub id in cfg's [model] fields replaced (in place; `apply=False`: only fetched) by its local path,
    downloading what is missing; progress as `download` events through `emit(kind, **fields)`, log lines
    (`show`) and `extra`."""
    import logging
    from . import resolve_model
    from .progress import both, logged, to_events
    fields = config_hub_fields(cfg)
    if not fields:
        return cfg
    for noisy in ("httpx", "httpx2", "httpcore", "httpcore2"):  # one INFO line per HTTP request otherwise
        logging.getLogger(noisy).setLevel(logging.WARNING)
    progress = both(to_events(emit) if emit else None, logged(logging.getLogger(__name__)) if show else None, extra)
    token = hub_token(cfg)
    for key, name, spec in fields:
        path = resolve_model(spec, progress=progress, key=key, token=token, kind=FIELD_KINDS.get(name, "files"),
                             offline=_offline(cfg))
        if apply:
            setattr(cfg.model, name, str(path))
    return cfg


def plan_lines(cfg) -> list[str]:
    """One line per hub id for the plan: what will be downloaded and the free space (network: the listing
    and small files only), or why it cannot be."""
    from . import plan_model
    from .hub import HubSettings, cached_snapshot
    from . import _selector
    lines = []
    settings = HubSettings.from_env(offline=_offline(cfg))
    for key, name, spec in config_hub_fields(cfg):
        kind = FIELD_KINDS.get(name, "files")
        if cached_snapshot(settings, spec, _selector(spec, kind, None)[1]) is not None:
            lines.append(f"{key}: {spec}: in the Hugging Face cache ({settings.cache_dir}), nothing to download")
            continue
        if settings.offline:
            from .messages import offline_message
            lines.append(offline_message(spec, key))
            continue
        try:
            plan = plan_model(spec, key=key, token=hub_token(cfg), kind=kind)
            lines.append(f"{key}: {plan.line()}")
            if plan.download_bytes + 256 * 1024 ** 2 > plan.free_bytes:
                lines.append(f"{key}: not enough free space: the run will refuse to start")
        except ConfigError as e:
            lines.append(str(e))
    return lines


def fetch_before_training(cfg, main: bool) -> None:
    """The trainer's first act: hub ids in cfg's model fields -> local paths, on every rank and before the
    process group exists, so a long download never meets a collective's timeout (the other ranks wait on
    the repo's lock and then find the files cached). Rank 0 reports: `download` events in the run folder
    and progress lines appended to its train.log. cfg keeps the ids (the run's config.toml shows them); the
    loader's resolve_config_models then finds them cached, without the network."""
    if not config_hub_fields(cfg):
        return
    from ..run.contract import LOG_FILE
    from ..run.events import RunEvents
    from ..run.run_folder import has_marker
    from .progress import status_line
    own = main and has_marker(cfg.run_dir)
    events = RunEvents(cfg.run_dir, enabled=True, tensorboard=False) if own else None

    def to_log(status) -> None:
        import sys
        import time
        line = f"{time.strftime('%H:%M:%S')} INFO download: {status_line(status)}"
        print(line, file=sys.stderr, flush=True)
        if not own:
            return
        try:
            with open(cfg.run_dir / LOG_FILE, "a", encoding="utf-8") as log:
                log.write(line + "\n")
        except OSError:
            pass
    try:
        from .progress import Throttled
        resolve_config_models(cfg, emit=events.emit if events else None, show=False,
                              extra=Throttled(to_log, 5.0) if main else None, apply=False)
    finally:
        if events is not None:
            events.close()
