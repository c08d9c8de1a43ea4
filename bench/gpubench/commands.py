"""The two programs' command lines for one case: the same model, images, prompt, resolution, rank
(alpha = rank), batch, precision, learning rate and optimizer, each under observe.py.

Text: the diffusers examples embed the single instance prompt once and drop the text encoders
(SDXL and Flux by themselves, SD1.5 with its `--pre_compute_text_embeddings`), so ours caches its
text-encoder outputs too (`dataset.cache_text_encoder_outputs`). Latents: both encode the images
with the VAE every step; caching them is one of our options measured separately.
Pure: builds lists of strings.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from .cases import MODELS, Case

ROOT = Path(__file__).resolve().parents[2]
OBSERVE = Path(__file__).resolve().parent / "observe.py"
PROMPT = "a photo of sks dog"
T5_LENGTH = {False: 512, True: 32}  # Flux.1 dev's T5 length; the tiny model's tokenizer holds 32
# --attention: the SDPA kernels both programs may use (observe.py's GPUBENCH_SDPA) and our matching
# precision.attention. no-cudnn is our default; the example runs without cuDNN's kernel too, so both
# use the same kernels (with it, full-size Flux.1 broke on an H200: docs/gpu-bench.md)
ATTENTION = {"no-cudnn": ("flash,efficient,math", "sdpa"), "pytorch": ("", "sdpa_cudnn")}


def steps_plan(tiny: bool) -> tuple[int, int]:
    """(warm-up steps, timed steps): the median of 20 after 5 on a GPU; a token 1 + 3 on the CPU."""
    return (1, 3) if tiny else (5, 20)


def total_steps(tiny: bool, steps_before: int = 0) -> int:
    """What the programs are told to train: warm-up + timed + the FLOP-counted step + slack (the
    observer ends the process after the counted step), after the `steps_before` a resumed run
    continues from (both runs of the resume case are told the same length)."""
    warmup, measure = steps_plan(tiny)
    return steps_before + warmup + measure + 3


def mixed_precision(case: Case) -> str:
    return {"fp32": "no"}.get(case.precision, case.precision)


def observer_argv(case: Case, steps_log: Path, tiny: bool, stop_after: int = 0) -> list[str]:
    warmup, measure = steps_plan(tiny)
    argv = [sys.executable, str(OBSERVE), "--log", str(steps_log), "--warmup", str(warmup),
            "--measure", str(measure)]
    if not case.count_flops:
        argv.append("--no-flops")
    if stop_after:
        argv += ["--stop-after", str(stop_after)]
    return argv


def ours_argv(case: Case, *, model_dir: Path, images: Path, run_root: Path, run_name: str, steps_log: Path,
              tiny: bool, cpu: bool, stop_after: int = 0, steps_before: int = 0,
              attention: str = "no-cudnn") -> list[str]:
    """`stop_after`: SIGTERM after that step (the first run of the resume case); `steps_before`: the
    steps a resumed run already has (the resume case's both runs)."""
    sets = [f"model.path={json.dumps(str(model_dir))}", f"dataset.path={json.dumps(str(images))}",
            f"dataset.resolution={case.resolution}", f"dataset.class_tokens={json.dumps(PROMPT)}",
            "dataset.cache_text_encoder_outputs=true", "dataset.cache_auto=false",  # latents every step, as the
            f"output.dir={json.dumps(str(run_root))}",  # examples encode them (a case's own sets can cache them)
            f"output.name={run_name}", f"schedule.max_steps={total_steps(tiny, steps_before)}",
            f"schedule.batch_size={case.batch}", f"precision.mixed={mixed_precision(case)}", "optimizer.lr=1e-4",
            "schedule.seed=42", f"precision.attention={ATTENTION[attention][1]}"]
    if case.method == "lora" and not case.config:  # a preset names its own rank and targets
        targets = json.dumps(list(MODELS[case.model]["targets"]))
        sets += [f"network.rank={case.rank}", f"network.alpha={case.rank}", f"network.target_modules={targets}"]
    if cpu:
        sets.append("hardware.cpu=true")
    sets += list(case.sets)
    argv = observer_argv(case, steps_log, tiny, stop_after) + ["--module", "trainer_backend", "--", "train"]
    if case.config:
        argv += ["--config", str(ROOT / case.config)]
    for s in sets:
        argv += ["--set", s]
    return argv


def planner_argv(case: Case, ours: list[str]) -> list[str]:
    """The memory planner for the config `ours` (an ours_argv) trains: the same --config and --set list."""
    train = ours.index("train")
    return [sys.executable, str(Path(__file__).resolve().parent / "planned.py"), *ours[train + 1:]]


def example_argv(case: Case, *, example: Path, model_dir: Path, images: Path, output_dir: Path, steps_log: Path,
                 tiny: bool, cpu_torchvision: bool) -> list[str]:
    flags = ["--pretrained_model_name_or_path", str(model_dir), "--instance_data_dir", str(images),
             "--instance_prompt", PROMPT, "--output_dir", str(output_dir), "--resolution", str(case.resolution),
             "--train_batch_size", str(case.batch), "--rank", str(case.rank),
             "--max_train_steps", str(total_steps(tiny)), "--learning_rate", "1e-4", "--lr_scheduler", "constant",
             "--lr_warmup_steps", "0", "--mixed_precision", mixed_precision(case), "--seed", "42",
             "--checkpointing_steps", "1000000"]
    if case.model == "sd15":
        flags.append("--pre_compute_text_embeddings")
    if case.model == "flux":
        flags += ["--lora_alpha", str(case.rank), "--lora_layers", ",".join(MODELS["flux"]["targets"]),
                  "--max_sequence_length", str(T5_LENGTH[tiny]), "--guidance_scale", "1.0"]
    flags += list(case.example_flags)
    argv = observer_argv(case, steps_log, tiny)
    if cpu_torchvision:
        argv.append("--cpu-torchvision")
    return argv + ["--script", str(example), "--"] + flags
