"""Experiment tracking beyond TensorBoard: Weights & Biases through accelerate's trackers.

    Accelerator(log_with=log_with(cfg), ...)     # training.setup.make_accelerator
    start_tracking(cfg, accelerator, run)        # after open_run: init the W&B run, follow the events

The W&B run follows the run's event stream (events.attach_sink): `step` events become
train/loss, train/lr, train/epoch and train/samples, `validation` events validation/loss. The
config is logged resolved and without secrets. The API key is read by name
(logging.wandb_key_name) from the environment or cloud.secrets_file, handed to wandb through
this process's environment only, and masked in the logs: it never reaches config.toml, argv,
events or train.log (kohya_ss #2283 leaked it through the logged command line).
"""
from __future__ import annotations

import logging
import netrc
import os
from pathlib import Path
from urllib.parse import urlsplit

from ..config import ConfigError, TrainConfig, strip_secrets, to_dict
from ..run.contract import Event

LOG = logging.getLogger("trainer")
DEFAULT_PROJECT = "sd-studio"
WANDB_ENV_KEY = "WANDB_API_KEY"  # the variable wandb itself reads
# event -> {event field: W&B key}
LOGGED = {Event.STEP: {"loss": "train/loss", "lr": "train/lr", "epoch": "train/epoch", "samples": "train/samples"},
          Event.VALIDATION: {"loss": "validation/loss"},
          Event.EPOCH: {"epoch": "train/epochs_done"}}


def wanted(cfg: TrainConfig) -> bool:
    return cfg.logging.tracker == "wandb"


def log_with(cfg: TrainConfig) -> list[str] | None:
    """The `log_with` argument of Accelerator: ["wandb"] when selected (and installed), else None."""
    if not wanted(cfg):
        return None
    try:
        import wandb  # noqa: F401  (imported here so a missing package is reported before training)
    except ImportError:
        raise ConfigError("logging.tracker: 'wandb' needs the wandb package (.venv/bin/pip install wandb), "
                          "or set logging.tracker = \"none\"") from None
    return ["wandb"]


def _netrc_has_key(base_url: str) -> bool:
    """`wandb login` stores the key in ~/.netrc (or $NETRC) for the API host."""
    host = urlsplit(base_url).hostname or ""
    path = os.environ.get("NETRC") or str(Path.home() / ".netrc")
    try:
        return bool(host) and netrc.netrc(path).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


def api_key(cfg: TrainConfig) -> str | None:
    """The W&B API key from the environment or cloud.secrets_file (by name), or None."""
    from .secrets import Secrets
    return Secrets.from_config(cfg).get(cfg.logging.wandb_key_name)


def check_login(cfg: TrainConfig, key: str | None) -> None:
    """Online mode needs credentials; say where they can come from instead of letting wandb prompt."""
    if cfg.logging.wandb_mode != "online" or key:
        return
    base_url = os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")
    if os.environ.get("WANDB_IDENTITY_TOKEN_FILE") or _netrc_has_key(base_url):
        return
    raise ConfigError(f"logging.tracker: W&B is selected in online mode but you are not logged in: set "
                      f"{cfg.logging.wandb_key_name} in the environment or in cloud.secrets_file, run "
                      f"`wandb login`, or set logging.wandb_mode = \"offline\" (upload later with `wandb sync`)")


def logged_config(cfg: TrainConfig) -> dict:
    """The resolved config for the tracker, secret fields removed (the config holds only the
    names of secrets anyway)."""
    return strip_secrets(to_dict(cfg))


def init_kwargs(cfg: TrainConfig, run_dir: Path) -> dict:
    lg = cfg.logging
    kwargs = {"name": lg.wandb_run_name or cfg.output.name, "dir": str(run_dir), "mode": lg.wandb_mode,
              "tags": [cfg.network.type]}
    if lg.wandb_entity:
        kwargs["entity"] = lg.wandb_entity
    return {"wandb": kwargs}


class TrackerSink:
    """An events sink (events.attach_sink) that forwards step/validation/epoch values to the
    accelerate trackers, and finishes the W&B run when the run's events close."""

    def __init__(self, accelerator):
        self.accelerator = accelerator
        self.last_step = 0

    def handle(self, record: dict) -> None:
        names = LOGGED.get(record.get("event", ""))
        if not names:
            return
        values = {key: record[field] for field, key in names.items()
                  if isinstance(record.get(field), (int, float)) and not isinstance(record.get(field), bool)}
        if not values:
            return
        step = int(record.get("step", self.last_step) or 0)
        self.last_step = max(self.last_step, step)
        # W&B refuses steps that go backwards; validation/epoch events share the step they happened at
        self.accelerator.log(values, step=self.last_step)

    def close(self) -> None:
        for tracker in list(self.accelerator.trackers):
            if getattr(tracker, "name", "") == "wandb":
                tracker.finish()
                self.accelerator.trackers.remove(tracker)


def start_tracking(cfg: TrainConfig, accelerator, run) -> TrackerSink | None:
    """Start the W&B run (main process) and route the run's events to it; None when off."""
    if not wanted(cfg):
        return None
    key = api_key(cfg)
    check_login(cfg, key)
    if not accelerator.is_main_process:
        return None
    if key:
        from .secrets import mask_in_logs
        mask_in_logs({key})
        os.environ[WANDB_ENV_KEY] = key  # this process only; never argv, never a file
    os.environ.setdefault("WANDB_SILENT", "true")  # its banner would repeat what train.log says
    project = cfg.logging.wandb_project or DEFAULT_PROJECT
    try:
        accelerator.init_trackers(project, config=logged_config(cfg), init_kwargs=init_kwargs(cfg, run.dir))
    except Exception as e:  # wandb reports auth/network problems with many exception types
        raise ConfigError(f"logging.tracker: W&B could not start a run in project {project!r} "
                          f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); check the API key "
                          f"and the network, or set logging.wandb_mode = \"offline\"") from None
    from ..run.events import attach_sink
    sink = TrackerSink(accelerator)
    attach_sink(run.dir, sink)
    where = f"{run.dir / 'wandb'} (upload with `wandb sync`)" if cfg.logging.wandb_mode == "offline" else "online"
    LOG.info("W&B: project %s, run %s, %s", project, init_kwargs(cfg, run.dir)["wandb"]["name"], where)
    return sink
