"""Main-process services around checkpoints: secrets, the S3 store, the background uploader
and webhooks (both attached as events sinks), and choosing the checkpoint to resume from."""
from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..run.checkpoint_files import checkpoint_name, checkpoints_dir, list_checkpoints, step_of
from ..config import ConfigError, TrainConfig
from .secrets import MaskSecrets, Secrets, mask_in_logs

if TYPE_CHECKING:
    from .s3 import RemoteStore

LOG = logging.getLogger("trainer")


class RemoteUnreachable(RuntimeError):
    """The bucket cannot be listed and there is no local checkpoint to fall back on."""


@dataclass
class Services:
    store: "RemoteStore | None"
    secrets: Secrets
    mask: MaskSecrets             # .mask(text) for error messages that may quote a secret


def start_services(cfg: TrainConfig, run) -> Services:
    """Resolve secrets (ConfigError naming the key when one is missing), mask them in the
    logs, and attach the uploader and webhook sinks to the run's events."""
    from ..run.events import attach_sink
    secrets = Secrets.from_config(cfg)
    store = None
    if cfg.cloud.bucket:
        from .s3 import RemoteStore
        store = RemoteStore.from_config(cfg, secrets)
    from .webhooks import WebhookSink, resolve_targets
    targets = resolve_targets(cfg, secrets)
    values = {secrets.get(n) for n in (cfg.cloud.access_key_name, cfg.cloud.secret_key_name, "AWS_SESSION_TOKEN")}
    values |= {secrets.get(n) for t in cfg.webhooks.targets for n in (t.url_secret, t.auth_secret)}
    values |= set(secrets.file_values().values())
    mask = mask_in_logs({v for v in values if v})
    if store is not None:
        from .uploader import Uploader
        attach_sink(run.dir, Uploader(store, cfg, run.dir, run.events.emit, mask.mask))
    if targets:
        attach_sink(run.dir, WebhookSink(cfg, targets, cfg.output.name, run.started))
    return Services(store=store, secrets=secrets, mask=mask)


def _retry(fn, attempts: int = 3, first_delay: float = 1.0):
    for i in range(attempts):
        try:
            return fn()
        except Exception:
            if i == attempts - 1:
                raise
            time.sleep(first_delay * 2 ** i)


def choose_source(cfg: TrainConfig, run_dir: Path, services: Services) -> Path | None:
    """The local checkpoint folder to load (downloaded first when it is remote), or None for a
    fresh start. Every case is logged."""
    from ..run.resume import explicit_local, find_local
    resume, store = cfg.checkpoints.resume, services.store
    if resume == "none":
        _start_over(cfg, run_dir, services)
        return None
    if resume.startswith("s3://"):
        return _download_url(cfg, run_dir, services, resume)
    if resume != "auto":
        source = explicit_local(resume)
        LOG.info("resuming from %s (checkpoints.resume)", source.path)
        return source.path
    local = find_local(run_dir)
    remote = None
    if store is not None:
        try:  # patient only when the bucket is the sole hope (a local checkpoint is a fine fallback)
            found = _retry(store.checkpoints, attempts=1 if local is not None else 3)
            remote = found[-1] if found else None
        except Exception as e:
            error = services.mask.mask(f"{type(e).__name__}: {e}")
            if local is None:
                raise RemoteUnreachable(
                    f"cannot list {store.url()} ({error}) and there is no local checkpoint; refusing to start "
                    "from scratch while the bucket may hold this run's checkpoints. Check cloud.endpoint_url, "
                    "cloud.bucket and the credentials, or set checkpoints.resume = \"none\".") from None
            LOG.warning("cannot list %s (%s); resuming from the local checkpoint %s", store.url(), error, local)
    if remote is not None and (local is None or remote.step > step_of(local)):
        newer = f", newer than the local step {step_of(local)}" if local is not None else ""
        LOG.info("resuming from the bucket: %s (step %d%s); downloading",
                 store.url(f"checkpoints/{checkpoint_name(remote.step)}/"), remote.step, newer)
        return store.download_checkpoint(remote.key, checkpoints_dir(run_dir), checkpoint_name(remote.step))
    if local is not None:
        LOG.info("resuming from the local checkpoint %s", local)
        return local
    corrupt = list_checkpoints(run_dir)  # complete by their sizes, but not one matches its sha256
    if corrupt:
        names = ", ".join(p.name for p in corrupt)
        raise ConfigError(f"checkpoints.resume: every checkpoint in {checkpoints_dir(run_dir)} fails its sha256 check "
                          f"({names}); refusing to start over while they exist. Set checkpoints.resume = \"none\" "
                          "to start over (they are moved aside to checkpoints-replaced-…), or set it to a "
                          "checkpoint folder you trust")
    where = f" and none in {store.url('checkpoints/')}" if store is not None else ""
    LOG.info("starting fresh: no checkpoint in %s%s", checkpoints_dir(run_dir), where)
    return None


def _start_over(cfg: TrainConfig, run_dir: Path, services: Services) -> None:
    """resume = "none" in a folder that holds checkpoints: set them aside (never mixed with the
    new run's, which retention would otherwise prune by step number); refuse when the bucket
    holds checkpoints under this run's name."""
    store = services.store
    if store is not None:
        try:
            found = _retry(store.checkpoints)
        except Exception as e:
            raise RemoteUnreachable(f"cannot list {store.url()} ({services.mask.mask(str(e))})") from None
        if found:
            raise ConfigError(f"checkpoints.resume: \"none\", but {store.url('checkpoints/')} already holds "
                              f"checkpoints of a run named '{cfg.output.name}' (newest step {found[-1].step}): "
                              "use another output.name or cloud.prefix, delete them, or resume")
    if list_checkpoints(run_dir):
        aside = Path(run_dir) / f"checkpoints-replaced-{time.strftime('%Y%m%d-%H%M%S')}"
        os.replace(checkpoints_dir(run_dir), aside)
        LOG.warning("checkpoints.resume = \"none\": the earlier checkpoints were moved to %s", aside)
    LOG.info("starting fresh (checkpoints.resume = \"none\")")


def _download_url(cfg: TrainConfig, run_dir: Path, services: Services, url: str) -> Path:
    from .s3 import store_for_url
    try:
        store, key = store_for_url(cfg, services.secrets, url)
        manifest = _retry(lambda: store.get_json(key + "manifest.json"))
    except ValueError as e:
        raise ConfigError(f"checkpoints.resume: {e}") from None
    except Exception as e:
        raise ConfigError(f"checkpoints.resume: cannot read {url} ({services.mask.mask(str(e))})") from None
    if not manifest or not isinstance(manifest.get("step"), int):
        raise ConfigError(f"checkpoints.resume: {url} is not a complete checkpoint (no valid manifest.json)")
    LOG.info("resuming from %s (step %d); downloading", url, manifest["step"])
    return store.download_checkpoint(key, checkpoints_dir(run_dir), checkpoint_name(manifest["step"]))
