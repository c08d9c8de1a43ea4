"""`run`: install the carried wheels, build the models, run the planned cases one process each,
append one JSON line per case to <out>/results.jsonl as soon as it ends, print the table.

Fits short device bookings: `--budget-s` is the whole call (installs and model builds included);
a case starts if at least 60% of its estimate is left (`worth_starting`) and is killed when the
budget ends, and its line then holds what its steps so far measured (status "timeout": on an H200 a
Flux.1 case cut at step 19 of 26 still gave its it/s and peak; skipped at 88 s of 90 it gave
nothing). Cases that cannot run here (an option this trainer does not have, a missing package or
example script) get a "skipped" line saying why, so the report shows every planned case. Only
results.jsonl goes to <out> (the device returns at most 8 files); models, images, run folders and
logs stay in --work.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from . import cases as plan
from . import commands, report
from .monitor import MonitorSampler, screenshot, write_page
from .bundle import BUNDLE
from .measure import case_metrics, read_jsonl, resume_facts

ROOT = Path(__file__).resolve().parents[2]
MODELS_PY = Path(__file__).resolve().parent / "models.py"
# what the trainers and this session check need; printed by a subprocess as JSON
SESSION_PROBE = r"""
import importlib.util, json, sys
out = {"python": sys.version.split()[0]}
import torch
out["torch"] = torch.__version__
out["cuda"] = torch.cuda.is_available()
out["device_name"] = torch.cuda.get_device_name(0) if out["cuda"] else "cpu"
from importlib import metadata
for name in ("diffusers", "transformers", "peft", "accelerate", "pydantic", "tokenizers", "huggingface_hub",
             "safetensors", "torchvision", "bitsandbytes", "prodigyopt", "torchao"):
    try:
        out[name] = metadata.version(name)
    except metadata.PackageNotFoundError:
        out[name] = None
out["importable"] = {m: importlib.util.find_spec(m) is not None
                     for m in ("torchvision", "bitsandbytes", "prodigyopt", "torchao")}
from trainer_backend.config.schema import sections
out["option_keys"] = sorted(f"{s}.{k}" for s, cls in sections().items() for k in cls.model_fields)
import diffusers  # the examples need it; fail here, once, rather than in every case
print("GPUBENCH " + json.dumps(out))
"""


class Budget:
    def __init__(self, seconds: float):
        self.deadline = time.monotonic() + seconds

    def left(self) -> float:
        return self.deadline - time.monotonic()


def install_wheels(bundle: Path, site: Path) -> bool:
    """pip install --no-index into `site`; False when this bundle is installed there already (a warm
    machine keeps it between calls)."""
    wheels = sorted(str(p) for p in (bundle / "wheels").glob("*.whl"))
    if not wheels:
        raise SystemExit(f"run: no wheels in {bundle / 'wheels'}: run `python bench/gpu.py prepare` on the dev "
                         "machine and carry .gpubench/bundle")
    stamp, manifest = site / ".gpubench-bundle.json", (bundle / "bundle.json").read_text()
    if stamp.is_file() and stamp.read_text() == manifest:
        return False
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                    "--no-cache-dir", "--upgrade", "--target", str(site), *wheels], check=True)
    stamp.write_text(manifest)
    return True


START_FRACTION = 0.6  # of a case's estimate: less left, and its timed steps would not be reached


def worth_starting(left_s: float, est_s: float) -> bool:
    """Start a case with this much of the budget left? A case cut short still reports the steps it
    timed, so one that may not finish is worth more than one never started."""
    return left_s >= START_FRACTION * est_s


def child_env(site: Path | None, work: Path, cpu: bool, attention: str = "no-cudnn") -> dict:
    env = dict(os.environ)
    env["GPUBENCH_SDPA"] = commands.ATTENTION[attention][0]  # both programs, the same kernels
    paths = ([str(site)] if site else []) + [str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env.update(PYTHONPATH=os.pathsep.join(paths), PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false", SD_STUDIO_CACHE=str(work / "cache"),
               DIFFUSERS_VERBOSITY="warning")
    if cpu:
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def run_process(argv: list[str], env: dict, log: Path, timeout: float) -> tuple[int | None, float]:
    """(exit code or None when killed at the timeout, seconds). Own process group: a kill takes
    its children (dataloader workers, compile workers) with it."""
    start = time.monotonic()
    with open(log, "ab") as out:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=str(ROOT),
                                start_new_session=True)
        try:
            return proc.wait(timeout=max(timeout, 1)), time.monotonic() - start
        except subprocess.TimeoutExpired:
            for sig, grace in ((signal.SIGTERM, 15), (signal.SIGKILL, 15)):
                try:
                    os.killpg(proc.pid, sig)
                    proc.wait(timeout=grace)
                    break
                except (subprocess.TimeoutExpired, ProcessLookupError):
                    continue
            return None, time.monotonic() - start


def tail(log: Path, lines: int = 12) -> str:
    try:
        text = log.read_text(errors="replace").replace("\r", "\n")
    except OSError:
        return ""
    keep = [ln for ln in text.splitlines() if ln.strip() and "%|" not in ln and "Warning" not in ln]
    return "\n".join(keep[-lines:])


class Runner:
    def __init__(self, args):
        self.args = args
        self.tiny = args.tiny
        self.cpu = (args.device or ("cpu" if args.tiny else "cuda")) == "cpu"
        out = args.out or os.environ.get("OUT") or str(ROOT / ".gpubench" / "results")
        self.results = Path(out) / "results.jsonl"
        self.results.parent.mkdir(parents=True, exist_ok=True)
        default_work = ROOT / ".gpubench" / "work" if args.tiny else Path(tempfile.gettempdir()) / "gpubench"
        self.work = Path(args.work or default_work).resolve()
        self.work.mkdir(parents=True, exist_ok=True)
        self.bundle = Path(args.bundle)
        self.budget = Budget(args.budget_s)
        self.session: dict = {}
        self.built: dict[str, Path | None] = {}

    def append(self, record: dict) -> None:
        with open(self.results, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")

    def setup(self) -> dict:
        install = self.args.install == "yes" or (self.args.install == "auto" and not self.tiny)
        site = self.work / "site" if install else None
        if site:
            t = time.monotonic()
            if install_wheels(self.bundle, site):
                print(f"installed the carried wheels into {site} in {time.monotonic() - t:.0f} s", flush=True)
        self.env = child_env(site, self.work, self.cpu, self.args.attention)
        probe = subprocess.run([sys.executable, "-c", SESSION_PROBE], env=self.env, capture_output=True, text=True,
                               cwd=str(ROOT))
        line = next((ln for ln in probe.stdout.splitlines() if ln.startswith("GPUBENCH ")), None)
        if line is None:
            self.append({"kind": "session", "time": time.time(), "error": (probe.stderr or probe.stdout)[-2000:]})
            raise SystemExit(f"run: the environment check failed:\n{probe.stderr[-2000:]}")
        self.session = json.loads(line[len("GPUBENCH "):])
        manifest = self.bundle / "bundle.json"
        bundle_info = json.loads(manifest.read_text()).get("diffusers", {}) if manifest.is_file() else {}
        record = {"kind": "session", "time": time.time(), "tiny": self.tiny, "device": self.session["device_name"],
                  "budget_s": self.args.budget_s, "attention": self.args.attention, "cases": self.args.cases,
                  "part": self.args.part,
                  "examples": bundle_info, "peak_tflops": report.peak_tflops(self.session["device_name"]),
                  **{k: v for k, v in self.session.items() if k not in ("option_keys", "device_name")}}
        self.append(record)
        print(f"device {record['device']}, torch {record['torch']}, diffusers {record['diffusers']} "
              f"(examples from {bundle_info.get('ref', '?')}), results -> {self.results}", flush=True)
        return record

    def model_dir(self, model: str) -> Path | None:
        """Build on first use (its time goes on the budget); None if the build failed."""
        if model not in self.built:
            folder = self.work / "models" / (f"tiny-{model}" if self.tiny else model)
            if not self.tiny:
                self.make_room(model)
            log = self.work / "logs" / f"build-{model}.log"
            log.parent.mkdir(parents=True, exist_ok=True)
            argv = [sys.executable, str(MODELS_PY), "--model", model, "--out", str(folder),
                    "--device", "cpu" if self.cpu else "cuda"] + (["--tiny"] if self.tiny else [])
            rc, seconds = run_process(argv, self.env, log, self.budget.left())
            ok = rc == 0
            self.append({"kind": "build", "model": model, "tiny": self.tiny, "seconds": round(seconds, 1),
                         "status": "ok" if ok else "error", "log_tail": "" if ok else tail(log)})
            print(f"model {model}: {'built' if ok else 'FAILED'} in {seconds:.0f} s", flush=True)
            self.built[model] = folder if ok else None
        return self.built[model]

    def make_room(self, model: str) -> None:
        """The device's disk holds 64 GiB: remove other built models until this one fits (Qwen-Image is
        58 GiB in bf16); they are rebuilt if a later case needs them."""
        need = plan.MODELS[model].get("disk_gib", plan.DISK_GIB.get(model, 10)) + 4
        root = self.work / "models"
        root.mkdir(parents=True, exist_ok=True)
        for other in sorted(p for p in root.iterdir() if p.name != model):
            if shutil.disk_usage(root).free / 2 ** 30 >= need:
                return
            shutil.rmtree(other, ignore_errors=True)
            self.built.pop(other.name, None)
            print(f"removed the built {other.name} to make room for {model}", flush=True)

    def planned_peak(self, case: plan.Case, ours: list[str]) -> dict:
        """The memory planner's peak for the config the case trains (planned.py in the cases' environment)."""
        proc = subprocess.run(commands.planner_argv(case, ours), env=self.env, capture_output=True, text=True,
                              cwd=str(ROOT), timeout=300)
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("PLANNED ")), None)
        if line is None:
            return {"planned_error": (proc.stderr or proc.stdout).strip().splitlines()[-1:]}
        out = json.loads(line[len("PLANNED "):])
        return {"planned_gib": out["planned_gib"], "planned_phase": out["phase"], **(
            {"planned_why": out["why"]} if out["why"] else {})}

    def images(self, resolution: int) -> Path:
        folder = self.work / f"images-{resolution}"
        if not folder.is_dir():
            subprocess.run([sys.executable, str(MODELS_PY), "--images", str(folder), "--size", str(resolution)],
                           env=self.env, check=True)
        return folder

    def why_not(self, case: plan.Case) -> str:
        """A reason to skip the case before it starts, or ""."""
        missing = [k for k in case.option_keys() if k not in self.session["option_keys"]]
        if case.trainer == "ours" and missing:
            return f"option not in this trainer: {', '.join(missing)}"
        absent = [m for m in case.needs if not self.session["importable"].get(m)]
        if absent:
            return f"needs {', '.join(absent)} (not installed; prepare --profile lean --bitsandbytes carries it)"
        if self.cpu and "speed.compile_mode=reduce-overhead" in case.sets:
            return "CUDA graphs need a CUDA device (the trainer refuses them on the CPU: tests/test_speed.py)"
        if case.trainer == "diffusers" and not self.example(case).is_file():
            return f"no example script {self.example(case)}: run prepare"
        return ""

    def example(self, case: plan.Case) -> Path:
        return self.bundle / "examples" / plan.MODELS[case.model]["example"]

    def run_case(self, case: plan.Case) -> dict:
        base = {"kind": "case", "name": case.name, "group": case.group, "trainer": case.trainer,
                "variant": case.variant, "model": case.model, "method": case.method, "resolution": case.resolution,
                "batch": case.batch, "rank": case.rank, "precision": case.precision, "flops_key": case.flops_key,
                "sets": list(case.sets), "example_flags": list(case.example_flags), "tiny": self.tiny,
                "device": self.session.get("device_name")}
        reason = self.why_not(case)
        if not reason and not worth_starting(self.budget.left(), case.est_s):
            reason = f"out of time: {self.budget.left():.0f} s left of the budget, the case needs ~{case.est_s} s"
        model_dir = None if reason else self.model_dir(case.model)
        if not reason and model_dir is None:
            reason = f"the {case.model} model could not be built (see its build line)"
        if reason:
            return {**base, "status": "skipped", "reason": reason}
        slug = case.name.replace("/", "-")
        logs = self.work / "logs"
        steps_log, log = logs / f"{slug}.steps.jsonl", logs / f"{slug}.log"
        for stale in (steps_log, log):
            stale.unlink(missing_ok=True)
        images = self.images(case.resolution)
        run_root = self.work / "runs"
        subprocess.run(["rm", "-rf", str(run_root / slug), str(self.work / "example-out" / slug)], check=False)
        facts: dict = {}
        if case.trainer == "ours":
            stop_at = commands.steps_plan(self.tiny)[0] + 2 if case.kind == "resume" else 0

            def argv(stop_after=0, log_path=steps_log):
                return commands.ours_argv(case, model_dir=model_dir, images=images, run_root=run_root,
                                          run_name=slug, steps_log=log_path, tiny=self.tiny, cpu=self.cpu,
                                          stop_after=stop_after, steps_before=stop_at,
                                          attention=self.args.attention)
            if case.kind == "resume":  # the first run is stopped by SIGTERM after a few steps; the second resumes
                first_log = logs / f"{slug}.first.steps.jsonl"
                first_log.unlink(missing_ok=True)
                rc1, _ = run_process(argv(stop_at, first_log), self.env, log, self.budget.left())
                facts = {"first_run_rc": rc1, "stopped_after_step": stop_at}
            cmd = argv()
        else:
            cmd = commands.example_argv(case, example=self.example(case), model_dir=model_dir, images=images,
                                        output_dir=self.work / "example-out" / slug, steps_log=steps_log,
                                        tiny=self.tiny, cpu_torchvision=not self.session["importable"]["torchvision"])
        if case.planner:
            facts.update(self.planned_peak(case, cmd))
        t0 = time.time()
        sampler = MonitorSampler().start()  # the studio's GPU monitor, as the Run page reads it
        rc, seconds = run_process(cmd, self.env, log, self.budget.left())
        monitor = sampler.stop()
        if case.trainer == "ours" and sampler.samples:  # the last of our cases gives the page
            page = write_page(self.results.parent, case.name, sampler.table, sampler.samples, monitor)
            monitor["monitor_png"] = screenshot(page, self.results.parent / "monitor.png")
        facts.update(monitor)
        records = read_jsonl(steps_log)
        metrics = case_metrics(records, commands.steps_plan(self.tiny)[0], t0, case.batch)
        if case.kind == "resume":
            facts.update(resume_facts(run_root / slug))
        done = any(r.get("event") == "done" for r in records)
        status = "ok" if done else ("timeout" if rc is None else "error")
        if status == "ok" and case.kind == "resume" and not (facts.get("first_run_rc") == 75 and facts.get("resumed_at")):
            status = "error"
        record = {**base, "status": status, "rc": rc, "wall_s": round(seconds, 1), **metrics, **facts}
        if status != "ok":
            record["log_tail"] = tail(log)
        return record

    def run_all(self, chosen: list[plan.Case]) -> None:
        for case in chosen:
            record = self.run_case(case)
            self.append(record)
            print(report.one_line(record), flush=True)


def run(args) -> int:
    chosen = plan.planned(args)
    runner = Runner(args)
    print(f"{len(chosen)} cases, budget {args.budget_s:.0f} s: {', '.join(c.name for c in chosen)}", flush=True)
    runner.setup()
    runner.run_all(chosen)
    print()
    print(report.render(report.load(runner.results), peak_override=args.peak_tflops))
    return 0


def add_arguments(p) -> None:
    plan.add_arguments(p)
    p.add_argument("--device", choices=("cuda", "cpu"), default="", help="default: cuda, or cpu with --tiny")
    p.add_argument("--out", default="", help="folder for results.jsonl (default $OUT, else .gpubench/results)")
    p.add_argument("--work", default="", help="models, images, runs, logs (default: /tmp/gpubench; --tiny: "
                                               ".gpubench/work)")
    p.add_argument("--bundle", default=str(BUNDLE))
    p.add_argument("--budget-s", type=float, default=540.0, help="seconds for the whole call (the device's limit "
                                                                  "is 600 per command)")
    p.add_argument("--install", choices=("auto", "yes", "no"), default="auto",
                   help="install the carried wheels into <work>/site (auto: unless --tiny)")
    p.add_argument("--attention", choices=sorted(commands.ATTENTION), default="no-cudnn",
                   help="SDPA kernels for both programs: no-cudnn (flash, memory-efficient, math; our default) or "
                        "pytorch (PyTorch's own choice, cuDNN included)")
    p.add_argument("--peak-tflops", type=float, default=0.0, help="the device's dense bf16 peak, if not in the table")
