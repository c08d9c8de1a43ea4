"""The one training loop. Read `train` top to bottom: setup, then one iteration per
optimizer step, side concerns (events, checkpoints, stop requests) behind named calls.

Gradient accumulation is explicit: the loop groups `grad_accum` batches, skips DDP's
gradient sync (accelerator.no_sync; DeepSpeed: accelerator.sync_gradients) on all but the
last, and steps once per group. The last group of an epoch may be shorter (its loss is
averaged over the batches it has), so every epoch ends on an optimizer step, exactly as
plan.py counts.
"""
from __future__ import annotations

import contextlib
import logging
import math
import time

import torch

from ..config import TrainConfig, rules
from ..config.caching import auto_caching, with_auto_caching
from ..methods import adapter_switch, method_loss, method_run_config, method_validator, save_outputs, setup_method
from ..methods.class_images import prepare_class_images
from ..remote.wandb_tracking import start_tracking
from ..run import exitcodes
from ..run.checkpoint_files import TrainState
from ..run.checkpointer import Checkpointer
from ..run.contract import Event
from ..run.output_writes import written_or_explained
from ..run.scheduler_state import register_scheduler_state
from ..run.stop_signals import StopSignals
from ..diffusion.loss import LossParts
from .ema import make_ema
from .epoch_loaders import EpochLoaders
from .full_half_precision import keep_half_weights
from .host_sync import StepLosses, StepReadCounter, read_interval
from .compile import compile_blocks
from .memory_setup import install_after_prepare
from .optimizers import build_lr_scheduler, build_optimizer
from ..diffusion.sampling import SampleImages
from .setup import (build_dataset, load_base_model, make_accelerator, open_run, place_denoiser, place_encoders,
                    register_adapter_hooks, release_cache_memory, scan_data)

LOG = logging.getLogger("trainer")


class TrainingDiverged(RuntimeError):
    pass


def train(cfg: TrainConfig) -> int:
    from accelerate.utils import set_seed
    from ..launch.plan import plan_from_config
    caching = auto_caching(cfg)  # dataset.cache_auto: caches where nothing changes per step
    cfg = method_run_config(with_auto_caching(rules.check(cfg)))  # refuse bad combinations before anything
    # loads; the method's adjustments (a VAE run: its own precision, no caches)
    accelerator = make_accelerator(cfg)
    set_seed(cfg.schedule.seed)
    run = open_run(cfg, accelerator)
    LOG.info("caching: %s", caching.summary())
    start_tracking(cfg, accelerator, run)  # W&B (logging.tracker): follows the run's events
    model = load_base_model(cfg, accelerator, run.events)  # LoadedModel: model.family knows what its parts mean
    weight_dtype = place_encoders(model, cfg, accelerator)  # the denoiser waits for the cache pass
    cfg = prepare_class_images(cfg, model, accelerator, run, weight_dtype,  # DreamBooth: generate missing ones
                               place_denoiser=lambda: place_denoiser(model, cfg, accelerator))
    scan = scan_data(cfg, model.family)
    plan = plan_from_config(cfg, scan.counts, accelerator.num_processes)
    dataset = build_dataset(cfg, scan, plan.multi_counts, model, accelerator, run)  # the cache pass
    release_cache_memory(accelerator)
    place_denoiser(model, cfg, accelerator)  # only now: the caches never share the device with it
    total_steps = plan.multi.total_steps
    clips = scan.summary.get("video")  # a video run's clips (and what their audio tracks train: Family.clip_audio)
    run.events.emit(Event.PLAN, **plan.to_dict(), **({"video": clips} if clips else {}))
    LOG.info("plan: %d optimizer steps over %d epochs on %d process(es)", total_steps, plan.multi.epochs,
             accelerator.num_processes)

    trainable = setup_method(model, cfg, scan.class_samples)
    keep_half_weights(trainable, cfg, accelerator)  # precision.full_bf16/full_fp16 (no-op when off)
    optimizer = build_optimizer(cfg, trainable.param_groups, plan.lr_factor)
    lr_scheduler = build_lr_scheduler(cfg, optimizer, total_steps, plan.multi.warmup_steps)
    register_adapter_hooks(accelerator, trainable)
    prepared = accelerator.prepare(*trainable.modules.values(), optimizer, **placement(cfg, model, trainable))
    modules, optimizer = dict(zip(trainable.modules, prepared[:-1])), prepared[-1]
    install_after_prepare(cfg, model, trainable, optimizer, accelerator.device)  # block swap, fused backward
    register_scheduler_state(accelerator, lr_scheduler)  # lr_scheduler.json in each checkpoint
    compiled = compile_blocks(cfg, model, run.events, accelerator.device)  # speed.compile: each block, adapters inside (off: no-op)
    ema = make_ema(cfg, trainable, accelerator)
    batch_loss = method_loss(cfg, model, modules, weight_dtype, accelerator)  # diffusion or reconstruction

    signals = StopSignals(run.dir, accelerator.is_main_process)
    checkpointer = Checkpointer(cfg, accelerator, run, signals,  # triggers, retention, S3 sync, webhooks
                                export=lambda file_name: save_outputs(cfg, accelerator, run, model, trainable, state,
                                                                      scan, ema, file_name=file_name),
                                before_save=lambda: progress.flush())  # no checkpoint after a NaN loss
    state = checkpointer.resume(plan=plan, scan=scan, optimizer=optimizer, lr_scheduler=lr_scheduler)
    loaders = EpochLoaders(cfg, dataset, make_sampler(cfg, dataset, accelerator), plan.multi.epochs,
                           accelerator.device, accelerator.num_processes)  # the next epoch's workers start early
    progress = Progress(run, total_steps, state.global_step, accelerator.is_main_process, cfg,
                        read_interval(cfg, accelerator.device))  # losses read from the device every N steps
    host_reads = StepReadCounter(cfg.speed.count_host_reads, accelerator.device)  # diagnostics: the host's waits per step
    images = SampleImages(cfg, run, model, accelerator, weight_dtype, ema, trainable, adapter_switch(trainable),
                          caption=scan.items[0].caption if scan.items else "")  # + the adapter-effect check
    images.maybe_sample(state, before_training=True)
    validator = method_validator(cfg, model, accelerator, run, weight_dtype, modules)  # off: no-op
    stop = False
    try:
        for epoch in range(state.epoch, plan.multi.epochs):
            if state.global_step >= total_steps:  # resumed from the final checkpoint: that epoch
                state.epoch, state.batch_in_epoch = epoch + 1, 0  # counts, as in the uninterrupted run
                break
            loader = loaders.epoch(epoch, skip=state.batch_in_epoch)
            for group in accumulation_groups(loader, cfg.schedule.grad_accum):
                # ---- one optimizer step: forward/backward over the group, then step
                group_loss, parts = 0.0, LossParts(enabled=scan.class_samples > 0, audio=dataset.audio is not None)
                compiled.before_step(state.global_step + 1)  # the first step compiles: its own phase
                with host_reads.step(group):
                    for i, batch in enumerate(group):
                        with sync_only_on_last(accelerator, modules.values(), i == len(group) - 1):
                            loss = batch_loss(batch, epoch=epoch, parts=parts)
                            accelerator.backward(loss / len(group))
                        group_loss += loss.detach() / len(group)
                    lr_used = optimizer_step(accelerator, optimizer, lr_scheduler, trainable.parameters(), cfg)
                    mean_loss = count_step(state, len(group), group_loss, plan, accelerator)  # on the device
                compiled.after_step(state.global_step)
                # ---- bookkeeping and side concerns
                ema.step(state.global_step)
                progress.step(state, epoch, mean_loss, lr_used, **parts.reduce(accelerator), **host_reads.take())
                images.maybe_sample(state)
                validator.maybe_run(state)
                stop = checkpointer.after_step(state, epoch, mean_loss)
                if stop or state.global_step >= total_steps:
                    break
            if stop:
                break
            state.epoch, state.batch_in_epoch = epoch + 1, 0
            run.events.emit(Event.EPOCH, epoch=epoch + 1, step=state.global_step)
            images.maybe_sample(state, epoch_end=True)
            validator.maybe_run(state, epoch_end=True)
            checkpointer.at_epoch_end(state)
            if state.global_step >= total_steps:
                break
    finally:
        if not stop:  # a stop keeps its handlers until the checkpoint is uploaded (finish_stopped)
            signals.restore()
        loaders.close()
        progress.close()

    if stop:
        return finish_stopped(run, signals, state, accelerator)

    checkpointer.at_end(state)
    outputs = written_or_explained(run.dir, cfg.output.name,  # disk full: path, free space, what to do
                                   lambda: save_outputs(cfg, accelerator, run, model, trainable, state, scan, ema))
    images.final_check(state)  # a LoRA that barely changes the output is a warning, not a silent success
    run.events.emit(Event.DONE, step=state.global_step, outputs=outputs,
                    elapsed_s=round(time.time() - run.started, 1))
    run.events.close()
    accelerator.end_training()
    return exitcodes.OK


def placement(cfg: TrainConfig, model, trainable) -> dict:
    """accelerator.prepare's device placement: memory.block_swap keeps the denoiser's swapped blocks where
    they are (DeepSpeed, which block swap refuses, takes no placement argument at all)."""
    if not cfg.memory.block_swap or model.denoiser is None:
        return {}
    return {"device_placement": [*(m is not model.denoiser for m in trainable.modules.values()), True]}


def optimizer_step(accelerator, optimizer, lr_scheduler, params, cfg: TrainConfig) -> float:
    """Clip, step, advance the LR schedule, clear gradients; returns the LR this step trained with.
    With optimizer.fused_backward the weights already stepped during the backward pass (and the
    rules refused clipping): only the schedule advances here."""
    if cfg.optimizer.max_grad_norm > 0 and not cfg.optimizer.fused_backward:
        accelerator.clip_grad_norm_(params, cfg.optimizer.max_grad_norm)
    lr_used = lr_scheduler.get_last_lr()[0]
    if not cfg.optimizer.fused_backward:
        optimizer.step()
    lr_scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return lr_used


def finish_stopped(run, signals, state: TrainState, accelerator) -> int:
    """A stop (user, SIGTERM, preemption) after its checkpoint: say so, let uploads finish, exit 75."""
    kind = Event.STOPPED if signals.user_requested() else Event.PREEMPTED
    run.events.emit(kind, step=state.global_step, epoch=state.epoch)
    LOG.warning("%s at step %d; state saved. Resume by starting the same config again.", kind, state.global_step)
    run.events.close()  # waits (bounded) for the last checkpoint's upload
    accelerator.wait_for_everyone()  # a rank exiting 75 first makes the launcher kill the uploading main
    accelerator.end_training()  # trackers closed, process group destroyed (no gloo abort at exit)
    signals.restore()
    return exitcodes.STOPPED_SAVED


def make_sampler(cfg: TrainConfig, dataset, accelerator):
    from ..methods.dreambooth import batch_sampler  # pairs instance and class samples when there are both
    return batch_sampler(dataset, cfg.schedule.batch_size, num_processes=accelerator.num_processes,
                         process_index=accelerator.process_index, seed=cfg.schedule.seed)


def count_step(state: TrainState, batches: int, group_loss: torch.Tensor, plan, accelerator) -> torch.Tensor:
    """Advance the train state by one optimizer step; the step's loss averaged over ranks, left on the
    device (Progress reads it with the others every speed.host_read_every steps)."""
    state.global_step += 1
    state.batch_in_epoch += batches
    state.samples_seen += plan.multi.effective_batch
    return accelerator.reduce(torch.as_tensor(group_loss).reshape(1), reduction="mean")


def accumulation_groups(loader, grad_accum: int):
    group = []
    for batch in loader:
        group.append(batch)
        if len(group) == grad_accum:
            yield group
            group = []
    if group:
        yield group


@contextlib.contextmanager
def sync_only_on_last(accelerator, modules, last: bool):
    """One batch of an accumulation group. DDP: no gradient all-reduce but on the group's last
    batch (no_sync). DeepSpeed: the same boundary through accelerate's sync_gradients, so the
    engine accumulates until the last batch and steps there (see launch.deepspeed_config)."""
    accelerator.sync_gradients = last
    try:
        with contextlib.ExitStack() as stack:
            if not last and accelerator.num_processes > 1:
                for m in modules:
                    stack.enter_context(accelerator.no_sync(m))
            yield
    finally:
        accelerator.sync_gradients = True


def check_finite(loss: float, cfg: TrainConfig, step: int) -> None:
    if math.isfinite(loss):
        return
    advice = ("fp16 overflows easily: switch precision.mixed to bf16 (or no), lower optimizer.lr, "
              "or keep optimizer.max_grad_norm > 0") if cfg.precision.mixed == "fp16" else \
        "lower optimizer.lr, set optimizer.max_grad_norm (e.g. 1.0), or check the dataset for broken images"
    if cfg.precision.attention == "sdpa_cudnn":  # seen on an H200: NaN at step 2 from this kernel alone
        advice = ('first try precision.attention = "sdpa" (cuDNN\'s attention kernel, which "sdpa_cudnn" '
                  "allows, turned a Flux.1 LoRA's loss to NaN on an H200); else " + advice)
    raise TrainingDiverged(f"loss became {loss} at step {step}: {advice}; {last_good_checkpoint(cfg.run_dir)}")


def last_good_checkpoint(run_dir) -> str:
    """Where a diverged run can go on from: the newest complete checkpoint (never the diverged step's: the
    check runs before this step could be saved)."""
    from ..run.checkpoint_files import list_checkpoints
    saved = list_checkpoints(run_dir)
    if not saved:
        return "no checkpoint was saved before it (checkpoints.every_n_steps = 0?)"
    return (f"the last good checkpoint is {saved[-1]} (start the same config again to resume from it, "
            f"with the change)")


class Progress:
    """tqdm on the console, `step` events, TensorBoard scalars. The step losses stay on the device and are
    read every `read_every` steps in one transfer (training/host_sync.py): each is checked for NaN/inf and
    its step's event written then, with the rate and ETA of its own step."""

    def __init__(self, run, total: int, start: int, enabled: bool, cfg: TrainConfig, read_every: int = 1):
        from tqdm.auto import tqdm
        self.run, self.total, self.enabled, self.cfg = run, total, enabled, cfg
        self.bar = tqdm(total=total, initial=start, desc="train", disable=not enabled, dynamic_ncols=True)
        self.t0, self.start = time.time(), start
        self.losses, self.waiting = StepLosses(read_every), {}  # step -> the event's other fields

    def step(self, state: TrainState, epoch: int, loss: torch.Tensor, lr: float, **parts: float) -> None:
        """parts: extra terms for the event and TensorBoard (loss_instance, loss_prior, loss_audio, host_reads)."""
        self.losses.add(state.global_step, loss)
        done = state.global_step - self.start
        rate = done / max(time.time() - self.t0, 1e-9)
        eta = (self.total - state.global_step) / rate if rate > 0 else 0.0
        if self.enabled and (state.global_step % self.cfg.logging.log_every == 0 or state.global_step == self.total):
            self.waiting[state.global_step] = dict(total_steps=self.total, epoch=epoch + 1, samples=state.samples_seen,
                                                   lr=lr, it_per_s=round(rate, 4), eta_s=round(eta, 1), **parts)
        self.bar.update(1)
        if self.losses.due(state.global_step, self.total):
            self.flush()

    def flush(self) -> None:
        """Read the pending losses (every rank: all see a NaN and stop together); write their events."""
        for step, loss in self.losses.read():
            check_finite(loss, self.cfg, step)
            fields = self.waiting.pop(step, None)
            if fields is None:
                continue
            self.bar.set_postfix(loss=f"{loss:.4f}", lr=f"{fields['lr']:.2e}", refresh=False)
            self.run.events.emit(Event.STEP, step=step, loss=loss, **fields)
            parts = {k: v for k, v in fields.items() if k.startswith("loss_")}
            self.run.events.scalars(step, loss=loss, lr=fields["lr"], **parts)
            LOG.debug("step %d loss %.5f lr %.3e", step, loss, fields["lr"])

    def close(self) -> None:
        self.bar.close()
