"""The loop's one handle on checkpoints: resume at the start, save when a trigger fires,
apply retention, export LoRA files, and (main process) the cloud uploader and webhooks.

Triggers: every N optimizer steps, every multiple of keep_every_n_steps, every N epochs,
every M minutes, a stop signal, a save-now request, and the end of the run. Step, time,
signal and request triggers are agreed over all ranks after every optimizer step (one small
all-reduce), so every rank saves, or stops, at the same step. A step is saved at most once.
"""
from __future__ import annotations

import logging
import time
import uuid
from pathlib import Path
from typing import Callable

from .checkpoint_files import (TrainState, checkpoint_infos, clean_incomplete, is_valid, load_state, prune,
                               save_checkpoint)
from ..config import TrainConfig, rules, strip_secrets, to_dict
from .contract import CHECKPOINTS_DIR, MANIFEST_FILE, Event
from .safe_load import check_checkpoint_files, tensors_only
from .scheduler_state import legacy_scheduler_state
from .retention import RetentionPolicy, retained_steps
from .stop_signals import StopSignals

LOG = logging.getLogger("trainer")


class Checkpointer:
    def __init__(self, cfg: TrainConfig, accelerator, run, signals: StopSignals,
                 export: Callable[[str], list[str]] | None = None, before_save: Callable[[], None] | None = None):
        ck = cfg.checkpoints
        rules.check(cfg, "checkpoints")  # export_at and best_metric need their schedules (config/rules.py)
        self.cfg, self.accelerator, self.run, self.signals, self.export = cfg, accelerator, run, signals, export
        self.before_save = before_save  # the loop's pending step losses read (and checked) before a save
        self.policy = RetentionPolicy.from_config(ck)
        self.last_saved_step = -1
        self.last_save_time = time.monotonic()
        self._loss_sum, self._loss_count = 0.0, 0
        self.services = self.store = None
        self.observed: dict[str, float] = {}  # metrics reported by events (validation_loss)
        self._hash_checked: dict[tuple[str, int], bool] = {}  # (name, manifest mtime) -> files match it
        if accelerator.is_main_process:
            from .events import attach_sink
            from ..remote.connect import start_services
            self.services = start_services(cfg, run)
            self.store = self.services.store
            attach_sink(run.dir, _MetricSink(self.observed))

    # ------------------------------------------------------------------ start
    def resume(self, *, plan, scan, optimizer, lr_scheduler) -> TrainState:
        """Load the checkpoint chosen by checkpoints.resume into the accelerator (or start
        fresh) and return the trainer state; emits `start` (and `resumed`)."""
        from .resume import capture_hparams, check_compatible, dataset_fingerprint, restore_hparams
        from ..remote.connect import choose_source
        acc = self.accelerator
        fingerprint = dataset_fingerprint(scan)
        path = None
        if acc.is_main_process:
            clean_incomplete(self.run.dir)
            path = choose_source(self.cfg, self.run.dir, self.services)
            self._prune()  # retention holds after a restart too (a kill may have come before pruning)
        path = _broadcast(acc, path)
        if path is None:
            state, resumed_from = TrainState(), ""
        else:
            check_checkpoint_files(path)  # JSON, safetensors, or tensors-only pickles; refused otherwise
            state = load_state(path)
            safe = check_compatible(state, self.cfg, fingerprint, acc.num_processes, str(path))
            fresh = capture_hparams(optimizer, lr_scheduler)
            with tensors_only(), legacy_scheduler_state(acc, lr_scheduler, path):
                acc.load_state(str(path))
            changes = restore_hparams(optimizer, lr_scheduler, fresh)
            for line in safe:
                LOG.info("changed since the checkpoint (allowed): %s", line)
            for line in changes:
                LOG.info("applied to the optimizer: %s", line)
            LOG.info("resumed from %s at step %d (epoch %d, batch %d of the epoch)", path, state.global_step,
                     state.epoch, state.batch_in_epoch)
            self.run.events.emit(Event.RESUMED, step=state.global_step, path=str(path), changed=safe)
            self.last_saved_step = state.global_step
            resumed_from = str(path)
        state.run_id = state.run_id or uuid.uuid4().hex[:12]  # (checkpoints from before run ids)
        state.num_processes = acc.num_processes
        state.config = strip_secrets(to_dict(self.cfg))
        state.dataset_fingerprint = fingerprint
        state.plan = plan.to_dict()
        self.run.events.emit(Event.START, step=state.global_step, total_steps=plan.multi.total_steps,
                             epoch=state.epoch + 1, run_id=state.run_id, resumed_from=resumed_from,
                             remote=self.store.url() if self.store else "")
        return state

    # ------------------------------------------------------------------ triggers
    def after_step(self, state: TrainState, epoch: int, loss: float) -> bool:
        """After every optimizer step: save when due or asked; True when the run must stop
        (a checkpoint of this step was saved)."""
        ck, step = self.cfg.checkpoints, state.global_step
        self._loss_sum += loss
        self._loss_count += 1
        step_due = bool((ck.every_n_steps and step % ck.every_n_steps == 0)
                        or (ck.keep_every_n_steps and step % ck.keep_every_n_steps == 0))
        time_due = bool(ck.every_n_minutes and self.accelerator.is_main_process
                        and time.monotonic() - self.last_save_time >= ck.every_n_minutes * 60)
        stop, save_now, time_due = self.signals.agree(self.accelerator, self.signals.stop_requested,
                                                      self.signals.take_save_request(), time_due)
        if stop:
            self.signals.protect()  # a repeated signal must not cut the stop sequence short
            LOG.warning("stop requested: saving a checkpoint at step %d", step)
        trigger = ("stop" if stop else "request" if save_now else "steps" if step_due else
                   "time" if time_due else "")
        if trigger:
            state.epoch = epoch
            self._save(state, trigger, export=ck.export_at == "checkpoints")
        return stop

    def at_epoch_end(self, state: TrainState) -> None:
        """After the loop moved state to the next epoch (state.epoch = epochs completed)."""
        ck = self.cfg.checkpoints
        if ck.every_n_epochs and state.epoch % ck.every_n_epochs == 0:
            if self.last_saved_step != state.global_step:
                self._save(state, "epochs", export=ck.export_at in ("epochs", "checkpoints"))
            elif ck.export_at == "epochs":
                self._export(state)

    def at_end(self, state: TrainState) -> None:
        """The final checkpoint (checkpoints.at_end), so the run can be continued later."""
        if self.cfg.checkpoints.at_end and self.last_saved_step != state.global_step:
            self._save(state, "end", export=False)

    # ------------------------------------------------------------------ saving
    def _save(self, state: TrainState, trigger: str, export: bool) -> Path:
        if self.before_save is not None:
            self.before_save()  # raises on a non-finite loss: the last checkpoint stays the last good one
        mean = float(self._loss_sum / self._loss_count) if self._loss_count else None  # step losses may be tensors
        metrics = {**self.observed, **({"loss": mean} if mean is not None else {})}
        path = save_checkpoint(self.accelerator, self.run.dir, state, metrics=metrics, trigger=trigger)
        self._verified(path, written_now=True)
        self._loss_sum, self._loss_count = 0.0, 0
        self.last_saved_step, self.last_save_time = state.global_step, time.monotonic()
        exported = self._export(state, announce=False) if export else ""
        if self.accelerator.is_main_process:
            self._prune()
            LOG.info("checkpoint %s saved (%s)", path.name, trigger)
            self.run.events.emit(Event.CHECKPOINT, step=state.global_step, path=str(path), trigger=trigger,
                                 metrics=metrics, export=exported,
                                 remote=self.store.url(f"{CHECKPOINTS_DIR}/{path.name}/") if self.store else "")
        return path

    def _export(self, state: TrainState, announce: bool = True) -> str:
        """Write <name>-stepXXXXXXXX.safetensors through the loop's exporter (all ranks call)."""
        if self.export is None:
            return ""
        outputs = self.export(f"{self.cfg.output.name}-step{state.global_step:08d}.safetensors")
        exported = outputs[0] if outputs else ""
        if announce and exported and self.accelerator.is_main_process:
            self.run.events.emit(Event.EXPORT, step=state.global_step, path=exported)
        return exported

    def _prune(self) -> None:
        """Retention over the checkpoints whose files match their manifest's sha256: a corrupt one
        never takes a valid one's place (it is removed like any checkpoint retention does not keep)."""
        infos = []
        for step, path, metrics in checkpoint_infos(self.run.dir, with_paths=True):
            if self._verified(path):
                infos.append((step, metrics))
            else:
                LOG.warning("checkpoint %s does not match its manifest (sha256): it does not count as one of "
                            "the kept checkpoints and is removed", path)
        keep = retained_steps(infos, self.policy)
        for step in prune(self.run.dir, keep):
            LOG.info("pruned checkpoint step %d (checkpoints.keep_last=%d)", step, self.policy.keep_last)

    def _verified(self, path: Path, written_now: bool = False) -> bool:
        """sha256 check of a checkpoint, once per manifest (the ones this process wrote were hashed as
        they were written)."""
        try:
            key = (path.name, (path / MANIFEST_FILE).stat().st_mtime_ns)
        except OSError:
            return False
        if written_now:
            self._hash_checked[key] = True
        if key not in self._hash_checked:
            self._hash_checked[key] = is_valid(path, verify_hashes=True)
        return self._hash_checked[key]


class _MetricSink:
    """Keeps the latest validation loss (a `validation` event) for the checkpoint manifests."""

    def __init__(self, observed: dict[str, float]):
        self.observed = observed

    def handle(self, record: dict) -> None:
        if record.get("event") == "validation" and isinstance(record.get("loss"), (int, float)):
            self.observed["validation_loss"] = float(record["loss"])

    def close(self) -> None:
        pass


def _broadcast(accelerator, path: Path | None) -> Path | None:
    """The main process's choice, on every rank."""
    if accelerator.num_processes == 1:
        return path
    from accelerate.utils import broadcast_object_list
    box = [str(path) if path else None]
    broadcast_object_list(box)
    return Path(box[0]) if box[0] else None

