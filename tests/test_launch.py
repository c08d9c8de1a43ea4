"""Config → `accelerate launch` argv: golden argvs, checked again by accelerate's own parser and
config loader, a real 2-process CPU launch, and validation messages that name the key."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainer_backend.config import ConfigError, from_dict
from trainer_backend.launch.argv import (build_launch_argv, build_launch_env, ddp_kwargs, launcher_argv, node_commands,
                                    process_group_kwargs, validate_hardware, write_strategy_files)

PY = "/opt/venv/bin/python"
RUN = Path("/data/runs/my-lora")
CONFIG = RUN / "config.toml"
LAUNCH = [PY, "-m", "trainer_backend.launch.accelerate_launch", "--config_file", str(RUN / "accelerate_config.json")]
ENTRY = ["-m", "trainer_backend", "train", "--config", str(CONFIG)]


def cfg_with(**hardware):
    extra = hardware.pop("_extra", {})
    return from_dict({"hardware": hardware, **extra})


def argv(cfg, **kw):
    return build_launch_argv(cfg, CONFIG, PY, run_dir=RUN, main_process_port=29555, **kw)


# ----------------------------------------------------------------------------- golden argvs

def test_single_gpu():
    cfg = cfg_with()
    assert argv(cfg) == LAUNCH + ["--num_processes", "1", "--num_machines", "1", "--mixed_precision", "bf16",
                                  "--dynamo_backend", "no", "--main_process_port", "29555"] + ENTRY
    assert build_launch_env(cfg) == {}


def test_multi_gpu_with_gpu_ids():
    cfg = cfg_with(num_processes=2, gpu_ids="1,3", _extra={"precision": {"mixed": "fp16"}})
    assert argv(cfg) == LAUNCH + ["--multi_gpu", "--num_processes", "2", "--num_machines", "1",
                                  "--mixed_precision", "fp16", "--dynamo_backend", "no",
                                  "--main_process_port", "29555", "--gpu_ids", "1,3"] + ENTRY
    assert build_launch_env(cfg) == {"CUDA_VISIBLE_DEVICES": "1,3"}


def test_multi_node_gives_every_node_its_command():
    cfg = cfg_with(num_processes=4, num_machines=3, main_process_ip="10.1.2.3", main_process_port=29601)
    nodes = node_commands(cfg, CONFIG, PY, run_dir=RUN)
    assert len(nodes) == 3
    for rank, node in enumerate(nodes):
        assert node == LAUNCH + ["--multi_gpu", "--num_processes", "12", "--num_machines", "3",
                                 "--mixed_precision", "bf16", "--dynamo_backend", "no", "--main_process_port",
                                 "29601", "--machine_rank", str(rank), "--main_process_ip", "10.1.2.3"] + ENTRY
    # the port is shared even when the config leaves it to us
    auto = cfg_with(num_processes=1, num_machines=2, main_process_ip="h0")
    ports = {n[n.index("--main_process_port") + 1] for n in node_commands(auto, CONFIG, PY, run_dir=RUN)}
    assert ports == {"29500"}


def test_deepspeed():
    cfg = cfg_with(num_processes=2, strategy="deepspeed", deepspeed_zero_stage=2, deepspeed_offload_optimizer=True)
    assert argv(cfg) == LAUNCH + ["--use_deepspeed", "--deepspeed_config_file", str(RUN / "deepspeed.json"),
                                  "--num_processes", "2", "--num_machines", "1", "--mixed_precision", "bf16",
                                  "--dynamo_backend", "no", "--main_process_port", "29555"] + ENTRY


def test_fsdp():
    cfg = cfg_with(num_processes=8, strategy="fsdp")
    assert argv(cfg) == LAUNCH + ["--use_fsdp", "--num_processes", "8", "--num_machines", "1",
                                  "--mixed_precision", "bf16", "--dynamo_backend", "no",
                                  "--main_process_port", "29555"] + ENTRY


def test_cpu_multi_process_is_multi_gpu_plus_env_not_cpu_flag():
    cfg = cfg_with(num_processes=2, cpu=True, _extra={"precision": {"mixed": "no"}})
    assert argv(cfg) == LAUNCH + ["--multi_gpu", "--num_processes", "2", "--num_machines", "1",
                                  "--mixed_precision", "no", "--dynamo_backend", "no",
                                  "--main_process_port", "29555"] + ENTRY
    assert build_launch_env(cfg) == {"ACCELERATE_USE_CPU": "1"}
    single = cfg_with(cpu=True, _extra={"precision": {"mixed": "no"}})
    assert "--cpu" in argv(single) and "--multi_gpu" not in argv(single)


def test_paths_with_spaces_and_unicode_stay_single_arguments(tmp_path):
    run = tmp_path / "my runs" / "ünïcødé lora"
    cfg = cfg_with()
    out = build_launch_argv(cfg, run / "config.toml", PY, run_dir=run, main_process_port=29555)
    assert out[-1] == str(run / "config.toml") and out[4] == str(run / "accelerate_config.json")


def test_a_free_port_is_chosen_when_the_config_leaves_it_at_zero():
    out = build_launch_argv(cfg_with(num_processes=2), CONFIG, PY, run_dir=RUN)
    port = int(out[out.index("--main_process_port") + 1])
    assert 0 < port < 65536


# ----------------------------------------------------------------------------- accelerate reads them

GOLDEN = {
    "single": {},
    "multi": {"num_processes": 2, "gpu_ids": "0,1"},
    "node1": {"num_processes": 2, "num_machines": 2, "machine_rank": 1, "main_process_ip": "10.0.0.1"},
    "deepspeed": {"num_processes": 2, "strategy": "deepspeed", "deepspeed_zero_stage": 3,
                  "deepspeed_offload_params": True, "_extra": {"network": {"type": "full"}}},
    "fsdp": {"num_processes": 2, "strategy": "fsdp", "fsdp_sharding": "shard_grad_op", "fsdp_auto_wrap": "size",
             "_extra": {"network": {"type": "full"}}},
    "cpu2": {"num_processes": 2, "cpu": True, "_extra": {"precision": {"mixed": "no"}}},
}


@pytest.fixture(scope="module")
def accelerate_launch():
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.commands.launch import launch_command_parser
    return launch_command_parser(), load_config_from_file


@pytest.mark.parametrize("name", list(GOLDEN))
def test_accelerate_parses_the_argv_and_loads_the_generated_files(name, tmp_path, accelerate_launch):
    parser, load_config = accelerate_launch
    cfg = cfg_with(**dict(GOLDEN[name]))
    validate_hardware(cfg)
    run = tmp_path / "run dir ü"
    written = write_strategy_files(cfg, run)
    args = parser.parse_args(build_launch_argv(cfg, run / "config.toml", PY, run_dir=run)[3:])
    assert args.module and args.training_script == "trainer_backend"
    assert args.training_script_args == ["train", "--config", str(run / "config.toml")]
    hw = cfg.hardware
    assert args.num_processes == hw.num_processes * hw.num_machines
    assert args.mixed_precision == cfg.precision.mixed and args.dynamo_backend == "no"
    assert args.use_deepspeed == (hw.strategy == "deepspeed") and args.use_fsdp == (hw.strategy == "fsdp")
    assert args.multi_gpu == (hw.strategy == "ddp" and args.num_processes > 1)
    assert not args.cpu or args.num_processes == 1
    if hw.num_machines > 1:
        assert (args.machine_rank, args.main_process_ip) == (hw.machine_rank, hw.main_process_ip)
    cluster = load_config(args.config_file)
    assert cluster.num_processes == args.num_processes and cluster.mixed_precision == cfg.precision.mixed
    assert cluster.distributed_type.value == {"single": "NO", "multi": "MULTI_GPU", "node1": "MULTI_GPU",
                                              "deepspeed": "DEEPSPEED", "fsdp": "FSDP",
                                              "cpu2": "MULTI_CPU"}[name]
    if name == "deepspeed":
        ds = json.loads(Path(args.deepspeed_config_file).read_text())
        assert Path(args.deepspeed_config_file) in written
        assert ds["zero_optimization"]["stage"] == 3 and ds["zero_optimization"]["offload_param"]["device"] == "cpu"
        assert ds["train_batch_size"] == ds["train_micro_batch_size_per_gpu"] * ds["gradient_accumulation_steps"] * 2
        assert ds["bf16"]["enabled"] and not ds["fp16"]["enabled"]
        assert cluster.deepspeed_config["deepspeed_config_file"] == args.deepspeed_config_file
    if name == "fsdp":
        assert cluster.fsdp_config["fsdp_reshard_after_forward"] == "SHARD_GRAD_OP"
        assert cluster.fsdp_config["fsdp_auto_wrap_policy"] == "SIZE_BASED_WRAP"
        assert cluster.fsdp_config["fsdp_use_orig_params"] is True


def test_ddp_and_process_group_kwargs_build_accelerate_handlers():
    from accelerate.utils import DistributedDataParallelKwargs, InitProcessGroupKwargs
    cfg = cfg_with(ddp_static_graph=True, ddp_bucket_cap_mb=50, collective_timeout_s=7200)
    ddp = DistributedDataParallelKwargs(**ddp_kwargs(cfg)).to_kwargs()   # only non-default values
    assert ddp == {"static_graph": True, "bucket_cap_mb": 50, "gradient_as_bucket_view": True}
    timeout = InitProcessGroupKwargs(**process_group_kwargs(cfg)).timeout
    assert timeout.total_seconds() == 7200


PROBE = """
import json, sys
from pathlib import Path
import torch, torch.distributed as dist
from accelerate import Accelerator
state = Accelerator()  # like the trainer: ACCELERATE_USE_CPU reaches it through the environment
value = torch.tensor([float(state.process_index + 1)])
dist.all_reduce(value)
out = Path(sys.argv[1])
(out / f"rank{state.process_index}.json").write_text(json.dumps({
    "world": state.num_processes, "type": state.distributed_type.value, "backend": state.state.backend,
    "sum": value.item(), "arg": sys.argv[1]}))
state.end_training()  # destroys the process group: gloo threads left at exit can abort a rank
"""


@pytest.mark.both_cores
def test_real_two_process_cpu_launch(tmp_path):
    """The launcher part of the argv really starts 2 synchronised gloo ranks on the CPU."""
    cfg = cfg_with(num_processes=2, cpu=True, _extra={"precision": {"mixed": "no"}})
    run = tmp_path / "run ü"
    write_strategy_files(cfg, run)
    out = tmp_path / "out dir ß"
    out.mkdir()
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    command = launcher_argv(cfg, python=sys.executable, run_dir=run) + [str(probe), str(out)]
    env = {**os.environ, **build_launch_env(cfg), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    for r in ranks:
        assert (r["world"], r["type"], r["backend"], r["sum"], r["arg"]) == (2, "MULTI_CPU", "gloo", 3.0, str(out))


# ----------------------------------------------------------------------------- validation

@pytest.mark.parametrize("hardware,key", [
    ({"num_processes": 4, "gpu_ids": "0,1"}, "hardware.gpu_ids"),
    ({"num_processes": 2, "gpu_ids": "1,1"}, "hardware.gpu_ids"),
    ({"num_machines": 2}, "hardware.main_process_ip"),
    ({"num_machines": 2, "main_process_ip": "h0", "machine_rank": 2}, "hardware.machine_rank"),
    ({"machine_rank": 1}, "hardware.machine_rank"),
    ({"strategy": "deepspeed", "deepspeed_zero_stage": 3}, "hardware.deepspeed_zero_stage"),
    ({"strategy": "deepspeed", "deepspeed_offload_params": True}, "hardware.deepspeed_offload_params"),
    ({"strategy": "deepspeed", "deepspeed_offload_optimizer": True, "_extra": {"optimizer": {"name": "adamw8bit"}}},
     "optimizer.name"),
    ({"strategy": "deepspeed", "_extra": {"network": {"train_text_encoder": True}}}, "network.train_text_encoder"),
    ({"strategy": "deepspeed", "_extra": {"network": {"type": "full"}, "precision": {"mixed": "bf16",
                                                                                     "full_bf16": True}}},
     "precision.full_bf16"),
    ({"strategy": "fsdp", "_extra": {"optimizer": {"max_grad_norm": 1.0}}}, "optimizer.max_grad_norm"),
    ({"strategy": "fsdp", "_extra": {"optimizer": {"max_grad_norm": 1.0},
                                     "network": {"type": "full", "train_text_encoder": True}}},
     "optimizer.max_grad_norm"),
    ({"strategy": "fsdp", "fsdp_offload_params": True, "_extra": {"precision": {"mixed": "fp16"}}},
     "hardware.fsdp_offload_params"),
    ({"strategy": "fsdp", "cpu": True, "_extra": {"precision": {"mixed": "no"}}}, "hardware.strategy"),
    ({"cpu": True, "num_processes": 2, "_extra": {"precision": {"mixed": "fp16"}}}, "precision.mixed"),
    ({"multi_gpu_policy": "same_steps", "keep_steps_per_epoch": True}, "hardware.keep_steps_per_epoch"),
])
def test_incompatible_combinations_name_the_key(hardware, key):
    cfg = cfg_with(**hardware)
    with pytest.raises(ConfigError) as err:
        validate_hardware(cfg)
    assert str(err.value).startswith(key + ":")


def test_compatible_combinations_pass():
    for hardware in GOLDEN.values():
        validate_hardware(cfg_with(**dict(hardware)))
    validate_hardware(cfg_with(strategy="deepspeed", deepspeed_zero_stage=2, deepspeed_offload_optimizer=True))
