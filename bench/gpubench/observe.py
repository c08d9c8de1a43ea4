"""Run a training program unchanged and write one JSON line per optimizer step.

    python observe.py --log steps.jsonl --warmup 5 --measure 20 [--no-flops] [--stop-after K]
                      (--module trainer_backend | --script train_dreambooth_lora_sdxl.py) -- ARGS…

Why this and not parsing the programs' output: both trainers step a torch.optim optimizer once per
iteration (accelerate, fp16 loss scaling and accumulation call the real `step` only when a step
happens), so torch's global optimizer-step hook sees every step of either program in the same
way, with no change to their source (the example scripts run byte for byte as diffusers ships
them, through runpy) and no dependence on their tqdm or log format, whose refresh rate would
blur per-step times. Each step ends with a device synchronisation, so step intervals are device
time; both programs read the loss each step (`.item()`), so this adds no wait they did not have.

Per step it records the wall time and, on CUDA, `torch.cuda.max_memory_allocated()` (this process
is the case's own, so the peak covers exactly this run). After the warm-up and measured steps it
counts one more step's FLOPs with `torch.utils.flop_counter.FlopCounterMode` (that step is slow and
is not timed), then exits at once: a case ends when its numbers are in, without the programs'
final saves. `--stop-after K` sends this process SIGTERM after step K instead (the resume case).
Imports only torch and the standard library: it starts before the programs import anything.
"""
from __future__ import annotations

import argparse
import json
import os
import runpy
import signal
import sys
import time


class StepObserver:
    def __init__(self, log_path: str, warmup: int, measure: int, count_flops: bool, stop_after: int):
        import torch
        self.torch = torch
        self.log = open(log_path, "a", encoding="utf-8")
        self.steps = 0
        self.last_timed = warmup + measure
        self.count_flops = count_flops
        self.stop_after = stop_after
        self.flop_mode = None
        self.cuda = torch.cuda.is_available()
        # GPUBENCH_PROFILE_DIR: profile two steps after the timed ones (before the counted one) with
        # torch.profiler and write where the time went; the timed steps stay unprofiled.
        self.profile_dir = os.environ.get("GPUBENCH_PROFILE_DIR", "")
        self.profile_steps = 2 if self.profile_dir and not stop_after else 0
        self.profiler = None
        self.profile_end = 0
        self.log_path = log_path

    def write(self, record: dict) -> None:
        self.log.write(json.dumps(record) + "\n")
        self.log.flush()

    def after_step(self, optimizer, args, kwargs) -> None:
        torch = self.torch
        if self.cuda:
            torch.cuda.synchronize()
        self.steps += 1
        record = {"step": self.steps, "time": time.time()}
        if self.cuda:
            record["max_allocated"] = torch.cuda.max_memory_allocated()
            record["max_reserved"] = torch.cuda.max_memory_reserved()
        if self.profiler is not None:
            record["profiled"] = True  # not timed: the profiler slows the step
        if self.flop_mode is not None:  # the step that was counted ends here
            self.flop_mode.__exit__(None, None, None)
            record["flops"] = self.flop_mode.get_total_flops()
            self.flop_mode = None
        self.write(record)
        if self.steps == self.stop_after:
            os.kill(os.getpid(), signal.SIGTERM)  # the trainer finishes this step, saves and exits
            return
        if self.stop_after:
            return
        if self.steps == self.last_timed and self.profile_steps and self.profile_end == 0:
            from torch.profiler import ProfilerActivity, profile
            acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
            self.profiler = profile(activities=acts)
            self.profiler.__enter__()
            self.profile_t0, self.profile_end = time.time(), self.steps + self.profile_steps
            return
        if self.profiler is not None:
            if self.steps < self.profile_end:
                return
            self.write_profile(time.time() - self.profile_t0)
            self.last_timed = self.steps
        if self.steps == self.last_timed and self.count_flops:
            from torch.utils.flop_counter import FlopCounterMode
            self.flop_mode = FlopCounterMode(display=False)
            self.flop_mode.__enter__()  # counts the next step: forward, backward, optimizer
        elif self.steps >= self.last_timed:
            self.write({"event": "done", "time": time.time()})
            self.log.close()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)  # skip the programs' final saves and validation: not part of a step

    def write_profile(self, wall: float) -> None:
        prof, self.profiler = self.profiler, None
        prof.__exit__(None, None, None)
        events = prof.key_averages()
        n = self.profile_steps
        device_us = sum(getattr(e, "self_device_time_total", 0) for e in events)
        name = os.path.basename(self.log_path).replace(".steps.jsonl", "")
        os.makedirs(self.profile_dir, exist_ok=True)
        with open(os.path.join(self.profile_dir, f"{name}.prof.txt"), "w", encoding="utf-8") as f:
            f.write(f"{n} profiled steps: wall {wall / n * 1000:.1f} ms/step, device kernels "
                    f"{device_us / n / 1000:.1f} ms/step (busy {device_us / 1e6 / max(wall, 1e-9):.0%})\n\n")
            for key in ("self_device_time_total", "self_cpu_time_total"):
                try:
                    f.write(events.table(sort_by=key, row_limit=30, max_name_column_width=70) + "\n\n")
                except Exception as exc:  # the sort key's name differs between torch versions
                    f.write(f"(table by {key}: {exc})\n")


SDPA_SWITCHES = {"cudnn": "enable_cudnn_sdp", "flash": "enable_flash_sdp", "efficient": "enable_mem_efficient_sdp",
                 "math": "enable_math_sdp"}


def choose_sdpa_backends(names: str) -> list[str]:
    """GPUBENCH_SDPA=flash,efficient,math: only these attention kernels, for both programs alike
    (sdpa_check.py finds which one breaks at a model's shapes)."""
    chosen = [n.strip() for n in names.split(",") if n.strip()]
    if not chosen:
        return []
    unknown = sorted(set(chosen) - set(SDPA_SWITCHES))
    if unknown:
        raise SystemExit(f"GPUBENCH_SDPA: unknown backend(s) {unknown}; known: {sorted(SDPA_SWITCHES)}")
    import torch
    for name, switch in SDPA_SWITCHES.items():
        getattr(torch.backends.cuda, switch)(name in chosen)
    return chosen


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    split = argv.index("--") if "--" in argv else len(argv)
    ap = argparse.ArgumentParser(prog="observe.py", description=__doc__.splitlines()[0])
    ap.add_argument("--log", required=True)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--measure", type=int, default=20)
    ap.add_argument("--no-flops", action="store_true")
    ap.add_argument("--stop-after", type=int, default=0)
    target = ap.add_mutually_exclusive_group(required=True)
    target.add_argument("--module")
    target.add_argument("--script")
    ap.add_argument("--cpu-torchvision", action="store_true",
                    help="answer the script's own torchvision imports with cpu_torchvision.py (CPU check only)")
    args = ap.parse_args(argv[:split])
    program_args = argv[split + 1:]
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]  # our files never shadow theirs
    from torch.optim.optimizer import register_optimizer_step_post_hook
    observer = StepObserver(args.log, args.warmup, args.measure, not args.no_flops, args.stop_after)
    sdpa = choose_sdpa_backends(os.environ.get("GPUBENCH_SDPA", ""))
    observer.write({"event": "start", "time": time.time(), "pid": os.getpid(), **({"sdpa": sdpa} if sdpa else {})})
    register_optimizer_step_post_hook(observer.after_step)
    if args.module:
        sys.argv = [args.module, *program_args]
        runpy.run_module(args.module, run_name="__main__", alter_sys=True)
    else:
        script = os.path.abspath(args.script)
        sys.argv = [script, *program_args]
        sys.path.insert(0, os.path.dirname(script))
        init_globals = None
        if args.cpu_torchvision:
            sys.path.append(here)
            from cpu_torchvision import script_builtins
            init_globals = {"__builtins__": script_builtins()}
        runpy.run_path(script, init_globals=init_globals, run_name="__main__")


if __name__ == "__main__":
    main()
