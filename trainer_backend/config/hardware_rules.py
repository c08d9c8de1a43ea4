"""The cross-field rules of [hardware] and [precision] (config/rules.py runs them with the others):
combinations of processes, GPUs, machines, strategies and precisions that cannot work.
launch/argv.py `validate_hardware` and training/full_half_precision.py `check_precision_options` /
`check_half_weights` are thin wrappers over the groups here."""
from __future__ import annotations

from typing import Callable, Iterator

from .base import Problem
from .schema import TrainConfig

RULES: list[tuple[str, Callable[[TrainConfig], Iterator[Problem]]]] = []   # (group, rule)


def rule(group: str):
    def register(fn):
        RULES.append((group, fn))
        return fn
    return register

ADAPTER_TYPES = ("lora", "loha", "lokr")
VAE_FP16_REFUSED = Problem("vae.precision", "fp16 is refused for VAE training: the autoencoder's activations "
                                            "overflow fp16's range (largest value 65504) and the loss turns NaN; "
                                            "use fp32 (the default) or bf16")


def half_weights_dtype(cfg: TrainConfig) -> str:
    """"bf16", "fp16", or "" (off)."""
    p = cfg.precision
    return "bf16" if p.full_bf16 else "fp16" if p.full_fp16 else ""


@rule("half_weights")
def _half_weights(cfg: TrainConfig) -> Iterator[Problem]:
    p = cfg.precision
    if p.full_bf16 and p.full_fp16:
        yield Problem("precision.full_fp16", "choose one of full_bf16 and full_fp16")
        return
    kind = half_weights_dtype(cfg)
    if kind and p.mixed != kind:
        yield Problem(f"precision.full_{kind}", f"needs precision.mixed = \"{kind}\" (the forward pass runs in the "
                                                f"weights' dtype), got {p.mixed!r}")


@rule("precision")
def _vae_precision(cfg: TrainConfig) -> Iterator[Problem]:
    if cfg.network.type != "vae":
        return
    if cfg.vae.precision == "fp16":
        yield VAE_FP16_REFUSED
    if half_weights_dtype(cfg):
        yield Problem(f"precision.full_{half_weights_dtype(cfg)}", "half-precision weights are not used for VAE "
                                                                   "training (see vae.precision)")


@rule("hardware")
def _processes(cfg: TrainConfig) -> Iterator[Problem]:
    hw = cfg.hardware
    if hw.gpu_ids != "all" and not hw.cpu:
        ids = hw.gpu_ids.split(",")
        if len(set(ids)) != len(ids):
            yield Problem("hardware.gpu_ids", f"lists a GPU twice, got {hw.gpu_ids!r}")
        elif len(ids) < hw.num_processes:
            yield Problem("hardware.gpu_ids", f"lists {len(ids)} GPU(s) but hardware.num_processes is "
                                              f"{hw.num_processes} (one process per GPU)")
    if hw.num_machines > 1:
        if not hw.main_process_ip:
            yield Problem("hardware.main_process_ip", "required when hardware.num_machines > 1 (the address of "
                                                      "machine 0, reachable from every node)")
        if hw.machine_rank >= hw.num_machines:
            yield Problem("hardware.machine_rank", f"must be below hardware.num_machines ({hw.num_machines}), "
                                                   f"got {hw.machine_rank}")
    elif hw.machine_rank != 0:
        yield Problem("hardware.machine_rank", f"must be 0 on a single machine, got {hw.machine_rank}")
    if hw.keep_steps_per_epoch and hw.multi_gpu_policy != "same_samples":
        yield Problem("hardware.keep_steps_per_epoch", "applies to multi_gpu_policy = same_samples only")


@rule("hardware")
def _strategy(cfg: TrainConfig) -> Iterator[Problem]:
    hw = cfg.hardware
    if hw.cpu and cfg.precision.mixed == "fp16":
        yield Problem("precision.mixed", "fp16 needs a GPU; use bf16 or no with hardware.cpu = true")
    if hw.strategy != "ddp" and hw.cpu:
        yield Problem("hardware.strategy", f"{hw.strategy} needs CUDA GPUs; use ddp with hardware.cpu = true")
    if hw.strategy == "fsdp" and hw.fsdp_offload_params and cfg.precision.mixed == "fp16":
        yield Problem("hardware.fsdp_offload_params", "FSDP CPU offload with fp16 fails in the gradient scaler "
                                                      "(pytorch#111650); use precision.mixed = bf16 or turn the "
                                                      "offload off")
    if hw.strategy == "fsdp" and cfg.optimizer.max_grad_norm > 0 and (
            cfg.network.type != "full" or cfg.network.train_text_encoder):
        # accelerate clips through FSDP (norm over all shards) only when the clipped parameters are
        # exactly one wrapped model's; adapters or UNet + text encoders would be clipped by each
        # rank's own shard norm, a different factor on every GPU
        yield Problem("optimizer.max_grad_norm", "with FSDP, gradient clipping is exact only for a full fine-tune "
                                                 "of the UNet alone; set it to 0, or use hardware.strategy = ddp "
                                                 "(or deepspeed) for adapters and text-encoder training")


@rule("hardware")
def _deepspeed(cfg: TrainConfig) -> Iterator[Problem]:
    hw = cfg.hardware
    if hw.strategy != "deepspeed":
        return
    if hw.deepspeed_zero_stage == 3 and cfg.network.type in ADAPTER_TYPES:
        yield Problem("hardware.deepspeed_zero_stage", f"ZeRO-3 shards the frozen base model too, which "
                                                       f"{cfg.network.type} adapters on a frozen base do not support "
                                                       "here; use stage 2 (adapters are small, stage 2 already shards "
                                                       "their optimizer states and gradients)")
    if hw.deepspeed_offload_params and hw.deepspeed_zero_stage != 3:
        yield Problem("hardware.deepspeed_offload_params", f"parameter offload needs hardware.deepspeed_zero_stage "
                                                           f"= 3, got {hw.deepspeed_zero_stage}")
    if cfg.network.train_text_encoder and cfg.network.type != "vae":
        yield Problem("network.train_text_encoder", "DeepSpeed trains one model per run (the UNet); train the text "
                                                    "encoder(s) with hardware.strategy = ddp or fsdp")
    for key in ("full_bf16", "full_fp16"):
        if getattr(cfg.precision, key):
            yield Problem(f"precision.{key}", "DeepSpeed keeps its own fp32 master weights in the optimizer; use "
                                              "hardware.deepspeed_offload_optimizer to save memory, or strategy = "
                                              "ddp (or fsdp)")
    if hw.deepspeed_offload_optimizer and cfg.optimizer.name in ("adamw8bit", "paged_adamw8bit"):
        yield Problem("optimizer.name", f"{cfg.optimizer.name} (bitsandbytes) needs its states on the GPU and cannot "
                                        "run with hardware.deepspeed_offload_optimizer; use adamw or turn the offload "
                                        "off")
