"""Config → `accelerate launch` argv (pure: lists only, never a shell string; no torch).

The argv is `[python, -m, trainer_backend.launch.accelerate_launch, <flags>, -m, trainer_backend, train,
--config, <config>]` (accelerate's own launch, with the trainer's exit code and no launcher traceback
when the trainer fails: launch/accelerate_launch.py). Every launch passes `--config_file <run>/accelerate_config.json`, written by
`write_strategy_files`, so a user's own ~/.cache/huggingface/accelerate/default_config.yaml can
never turn a run into something else (accelerate reads that file whenever --config_file is
missing). DeepSpeed gets a generated `<run>/deepspeed.json`; FSDP settings sit in the accelerate
config. DDP options reach the trainer through the config (`ddp_kwargs`, `process_group_kwargs`).

CPU multi-process (tests): `--multi_gpu` plus env ACCELERATE_USE_CPU=1; `--cpu` would start one
process only (shared/FIELD-NOTES.md).
"""
from __future__ import annotations

import datetime
import json
import socket
import sys
from pathlib import Path
from typing import Any

from ..config import TrainConfig, rules

ACCELERATE_CONFIG = "accelerate_config.json"
DEEPSPEED_CONFIG = "deepspeed.json"
MULTI_NODE_DEFAULT_PORT = 29500
LAUNCHER = "trainer_backend.launch.accelerate_launch"


def total_processes(cfg: TrainConfig) -> int:
    return cfg.hardware.num_processes * cfg.hardware.num_machines


def free_port() -> int:
    """A TCP port free on this machine right now (for a single-machine run)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _port(cfg: TrainConfig, explicit: int | None) -> int:
    if explicit:
        return explicit
    if cfg.hardware.main_process_port:
        return cfg.hardware.main_process_port
    return MULTI_NODE_DEFAULT_PORT if cfg.hardware.num_machines > 1 else free_port()


def _run_dir(cfg: TrainConfig, run_dir: str | Path | None) -> Path:
    return Path(run_dir if run_dir is not None else cfg.run_dir).absolute()


# ----------------------------------------------------------------------------- argv

def launcher_argv(cfg: TrainConfig, *, python: str = sys.executable, run_dir: str | Path | None = None,
                  machine_rank: int | None = None, main_process_port: int | None = None) -> list[str]:
    """`python -m trainer_backend.launch.accelerate_launch <flags>` (accelerate's launch, without its
    traceback when the trainer fails): everything before the training entry point."""
    hw = cfg.hardware
    n_total = total_processes(cfg)
    files = _run_dir(cfg, run_dir)
    argv = [python, "-m", LAUNCHER, "--config_file", str(files / ACCELERATE_CONFIG)]
    if hw.strategy == "deepspeed":
        argv += ["--use_deepspeed", "--deepspeed_config_file", str(files / DEEPSPEED_CONFIG)]
        if hw.num_machines > 1:
            # "standard": every node runs its own command (no pdsh/ssh hostfile needed).
            argv += ["--deepspeed_multinode_launcher", "standard"]
    elif hw.strategy == "fsdp":
        argv += ["--use_fsdp"]
    elif n_total > 1:
        argv += ["--multi_gpu"]
    elif hw.cpu:
        argv += ["--cpu"]
    argv += ["--num_processes", str(n_total), "--num_machines", str(hw.num_machines),
             "--mixed_precision", cfg.precision.mixed, "--dynamo_backend", "no",
             "--main_process_port", str(_port(cfg, main_process_port))]
    if hw.gpu_ids != "all" and not hw.cpu:
        argv += ["--gpu_ids", hw.gpu_ids]
    if hw.num_machines > 1:
        rank = hw.machine_rank if machine_rank is None else machine_rank
        argv += ["--machine_rank", str(rank), "--main_process_ip", hw.main_process_ip]
    return argv


def trainer_entry(config_path: str | Path) -> list[str]:
    return ["-m", "trainer_backend", "train", "--config", str(config_path)]


def build_launch_argv(cfg: TrainConfig, config_path: str | Path, python: str = sys.executable,
                      machine_rank: int | None = None, *, run_dir: str | Path | None = None,
                      main_process_port: int | None = None) -> list[str]:
    """The full argv that starts training on this machine (strategy files from `run_dir`,
    default cfg.run_dir; port: explicit, else hardware.main_process_port, else a free one)."""
    return launcher_argv(cfg, python=python, run_dir=run_dir, machine_rank=machine_rank,
                         main_process_port=main_process_port) + trainer_entry(config_path)


def node_commands(cfg: TrainConfig, config_path: str | Path, python: str = sys.executable, *,
                  run_dir: str | Path | None = None) -> list[list[str]]:
    """The exact argv for every node of the run (index = machine rank), sharing one port."""
    port = _port(cfg, None)
    return [build_launch_argv(cfg, config_path, python, rank, run_dir=run_dir, main_process_port=port)
            for rank in range(cfg.hardware.num_machines)]


def build_launch_env(cfg: TrainConfig) -> dict[str, str]:
    """Environment variables to add to os.environ for the launch."""
    hw = cfg.hardware
    if hw.cpu:
        return {"ACCELERATE_USE_CPU": "1"}
    return {"CUDA_VISIBLE_DEVICES": hw.gpu_ids} if hw.gpu_ids != "all" else {}


# ----------------------------------------------------------------------------- files in the run dir

def accelerate_config(cfg: TrainConfig, run_dir: str | Path | None = None) -> dict[str, Any]:
    """The ClusterConfig that `--config_file` points at (JSON, read by accelerate itself)."""
    hw = cfg.hardware
    n_total = total_processes(cfg)
    if hw.strategy == "deepspeed":
        kind = "DEEPSPEED"
    elif hw.strategy == "fsdp":
        kind = "FSDP"
    elif n_total > 1:
        kind = "MULTI_CPU" if hw.cpu else "MULTI_GPU"
    else:
        kind = "NO"
    out: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE", "distributed_type": kind, "mixed_precision": cfg.precision.mixed,
        "use_cpu": hw.cpu, "debug": False, "num_processes": n_total, "num_machines": hw.num_machines,
        "machine_rank": 0, "gpu_ids": "all" if hw.cpu else hw.gpu_ids, "rdzv_backend": "static",
        "same_network": False,
        "main_training_function": "main", "enable_cpu_affinity": False, "downcast_bf16": False,
    }
    if hw.num_machines > 1:
        out["main_process_ip"] = hw.main_process_ip
        out["main_process_port"] = hw.main_process_port or MULTI_NODE_DEFAULT_PORT
    if hw.strategy == "deepspeed":
        out["deepspeed_config"] = {"deepspeed_config_file": str(_run_dir(cfg, run_dir) / DEEPSPEED_CONFIG),
                                   "zero3_init_flag": False}
    if hw.strategy == "fsdp":
        out["fsdp_config"] = fsdp_config(cfg)
    return out


def fsdp_config(cfg: TrainConfig) -> dict[str, Any]:
    hw = cfg.hardware
    wrap = {"transformer": "TRANSFORMER_BASED_WRAP", "size": "SIZE_BASED_WRAP", "none": "NO_WRAP"}[hw.fsdp_auto_wrap]
    out = {"fsdp_version": 1, "fsdp_reshard_after_forward": hw.fsdp_sharding.upper(),
           "fsdp_auto_wrap_policy": wrap, "fsdp_offload_params": hw.fsdp_offload_params,
           "fsdp_backward_prefetch": "BACKWARD_PRE", "fsdp_state_dict_type": "FULL_STATE_DICT",
           "fsdp_forward_prefetch": False, "fsdp_sync_module_states": True,
           # frozen base + trainable adapters in one unit need the original parameters kept
           "fsdp_use_orig_params": True, "fsdp_cpu_ram_efficient_loading": False}
    if hw.fsdp_auto_wrap == "transformer":
        out["fsdp_transformer_layer_cls_to_wrap"] = hw.fsdp_wrap_classes
    if hw.fsdp_auto_wrap == "size":
        out["fsdp_min_num_params"] = hw.fsdp_min_params
    return out


def deepspeed_config(cfg: TrainConfig) -> dict[str, Any]:
    """DeepSpeed JSON with explicit values (our dataloader is not prepared by accelerate, so
    "auto" batch sizes could not be filled in)."""
    hw, sched = cfg.hardware, cfg.schedule
    zero: dict[str, Any] = {"stage": hw.deepspeed_zero_stage, "overlap_comm": True, "contiguous_gradients": True}
    if hw.deepspeed_offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if hw.deepspeed_offload_params:
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    if hw.deepspeed_zero_stage == 3:
        zero["stage3_gather_16bit_weights_on_model_save"] = True
    # The loop accumulates itself (a short last group ends each epoch, as plan.py counts) and tells
    # the engine where a group ends through accelerate's sync_gradients; DeepSpeed's own count
    # stays 1 so the engine neither rescales the loss by it nor steps on its own schedule.
    out: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": sched.batch_size,
        "gradient_accumulation_steps": 1,
        "train_batch_size": sched.batch_size * total_processes(cfg),
        "gradient_clipping": cfg.optimizer.max_grad_norm,
        "zero_optimization": zero,
        "bf16": {"enabled": cfg.precision.mixed == "bf16"},
        "fp16": {"enabled": cfg.precision.mixed == "fp16", "loss_scale": 0, "initial_scale_power": 16,
                 "loss_scale_window": 1000, "hysteresis": 2, "min_loss_scale": 1},
        "steps_per_print": 10 ** 9,
        "wall_clock_breakdown": False,
    }
    if hw.deepspeed_offload_optimizer:
        # our optimizer is a torch/third-party one, not DeepSpeedCPUAdam
        out["zero_allow_untested_optimizer"] = True
        out["zero_force_ds_cpu_optimizer"] = False
    return out


def write_strategy_files(cfg: TrainConfig, run_dir: str | Path) -> list[Path]:
    """Write the files the argv points at into the run dir; returns their paths."""
    directory = _run_dir(cfg, run_dir)
    directory.mkdir(parents=True, exist_ok=True)
    written = [directory / ACCELERATE_CONFIG]
    written[0].write_text(json.dumps(accelerate_config(cfg, directory), indent=1), encoding="utf-8")
    if cfg.hardware.strategy == "deepspeed":
        written.append(directory / DEEPSPEED_CONFIG)
        written[1].write_text(json.dumps(deepspeed_config(cfg), indent=1), encoding="utf-8")
    return written


# ----------------------------------------------------------------------------- trainer-side kwargs

def ddp_kwargs(cfg: TrainConfig) -> dict[str, Any]:
    """Keyword arguments for accelerate's DistributedDataParallelKwargs."""
    hw = cfg.hardware
    return {"gradient_as_bucket_view": hw.ddp_gradient_as_bucket_view, "static_graph": hw.ddp_static_graph,
            "find_unused_parameters": hw.ddp_find_unused_parameters, "bucket_cap_mb": hw.ddp_bucket_cap_mb}


def process_group_kwargs(cfg: TrainConfig) -> dict[str, Any]:
    """Keyword arguments for accelerate's InitProcessGroupKwargs (every strategy)."""
    return {"timeout": datetime.timedelta(seconds=cfg.hardware.collective_timeout_s)}


# ----------------------------------------------------------------------------- validation

def validate_hardware(cfg: TrainConfig) -> None:
    """Raise ConfigError naming the key for combinations that cannot work (config/hardware_rules.py)."""
    rules.check(cfg, "hardware")


def hardware_notes(cfg: TrainConfig) -> list[str]:
    """Non-fatal remarks worth showing next to the launch command."""
    hw, notes = cfg.hardware, []
    if hw.cpu and total_processes(cfg) > 1:
        notes.append("CPU multi-process runs use the gloo backend: fine for tests, slow for real training")
    if hw.strategy == "fsdp" and total_processes(cfg) == 1:
        notes.append("FSDP on one process shards nothing; ddp is simpler")
    if hw.strategy != "ddp":
        notes.append(f"hardware.ddp_* options do not apply to {hw.strategy}")
    if hw.num_machines > 1:
        notes.append("every node needs the same project, model, dataset and config paths (or a shared file "
                     "system); start the command for each machine rank on that machine")
    return notes
