"""bench/gpu.py's issue-34 cases checked on the CPU before a GPU minute is spent on them: every case's
settings are a config the trainer accepts (a typo in a --set or a preset would otherwise cost a device
call), the suites name real cases, the new full-size builders construct every component from its bundled
config (on the meta device), and a tiny run goes through the same runner code as the device call: a
first-sample case with the planner's peak, a tier preset, the studio's monitor page with its screenshot,
and CUDA graphs skipped with the reason on a CPU."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from gpubench import cases, commands  # noqa: E402


def _config_of(argv: list[str]):
    """The config a trainer argv (ours_argv) loads: its --config and --set list."""
    from trainer_backend.config import load_config
    train = argv.index("train")
    rest, config, overrides = argv[train + 1:], None, []
    for flag, value in zip(rest[::2], rest[1::2]):
        if flag == "--config":
            config = value
        else:
            overrides.append(value)
    return load_config(config, overrides)


@pytest.mark.parametrize("case", [c for c in cases.catalogue() if c.trainer == "ours"], ids=lambda c: c.name)
def test_every_case_of_ours_is_a_config_the_trainer_accepts(case, tmp_path):
    """As the device runs it (full size, CUDA): it loads, and no cross-field rule refuses it."""
    from trainer_backend.config import rules
    from trainer_backend.config.schema import sections
    keys = {f"{s}.{k}" for s, cls in sections().items() for k in cls.model_fields}
    missing = [k for k in case.option_keys() if k not in keys]
    if missing:  # the runner skips such a case, saying which option is missing; only these may be
        assert missing == ["precision.channels_last"]  # (docs/gpu-bench.md: options the trainer lacks)
        return
    argv = commands.ours_argv(case, model_dir=tmp_path / "model", images=tmp_path, run_root=tmp_path,
                              run_name="r", steps_log=tmp_path / "s", tiny=False, cpu=False)
    cfg = _config_of(argv)
    assert [str(p) for p in rules.problems(cfg)] == []
    if case.config:  # the preset's own settings survive the bench's --set list
        assert cfg.dataset.resolution == case.resolution and cfg.model.arch != "auto"


def test_the_suites_name_cases_of_the_catalogue_and_fit_a_call():
    names = {c.name for c in cases.catalogue()}
    for suite, parts in cases.SUITES.items():
        chosen = cases.select(suite)
        assert chosen and all(p in names or p in cases.groups() for p in parts)
        assert cases.part_cost(chosen, {m: s["build_s"] for m, s in cases.MODELS.items()}) < 800, suite
    # the headline comes first: ours and the example, then every option together
    assert [c.name for c in cases.select("issue34-sdxl")][:3] == [
        "sdxl-lora/ours/baseline", "sdxl-lora/diffusers/baseline", "sdxl-options/ours/all"]
    with pytest.raises(SystemExit, match="suites: issue34-sdxl"):
        cases.select("issue34-nonsense")


def test_the_tier_cases_cover_every_tier_preset_of_a_buildable_model():
    tiers = {c.variant: c for c in cases.catalogue() if c.group == "tiers"}
    for path in (ROOT / "presets").glob("*-*gb.toml"):
        if path.stem.rsplit("-", 1)[1] not in cases.TIERS:
            continue
        arch = cases._preset_arch(path.read_text())
        if arch in {spec["arch"] for spec in cases.MODELS.values()} and arch != "flux2" or path.stem.startswith(
                "flux2-klein-4b"):
            assert path.stem in tiers and tiers[path.stem].config == f"presets/{path.name}"
    assert {"sdxl-lora-12gb", "flux-dev-lora-24gb", "zimage-turbo-lora-16gb", "qwen-image-lora-24gb",
            "flux2-klein-4b-lora-12gb"} <= set(tiers)


@pytest.mark.slow
@pytest.mark.parametrize("model", ["zimage", "flux2_klein", "qwen_image"])
def test_the_full_size_builders_construct_every_component(model, tmp_path):
    out = subprocess.run([sys.executable, "-c", (
        "import sys; sys.path.insert(0, 'bench/gpubench'); import models; from pathlib import Path; "
        f"models.build_from_tiny({model!r}, Path({str(tmp_path / 'm')!r}), 'meta')")],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-2000:]
    built = [ln for ln in out.stdout.splitlines() if "B parameters" in ln]
    assert [ln.split(":")[0] for ln in built] == [f"{model}/transformer", f"{model}/vae", f"{model}/text_encoder"]
    billions = float(built[0].split()[-3])
    assert billions > {"zimage": 6, "flux2_klein": 3.8, "qwen_image": 20}[model]  # the real sizes, not the tiny


def test_a_tiny_run_goes_through_the_device_call_s_code(tmp_path):
    """The same runner as on the GPU, on the CPU with the builtin tiny models: results as each case ends,
    the planner's peak beside a first-sample case, a tier preset trained, the monitor page (and its
    screenshot where chromium is installed), CUDA graphs skipped with the reason."""
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "bench/gpu.py", "run", "--tiny", "--device", "cpu", "--out", str(out),
                           "--work", str(tmp_path / "work"), "--cases",
                           "flux2-klein-lora,tiers/ours/sdxl-lora-12gb,sdxl-options/ours/cuda-graphs"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    records = {r["name"]: r for r in map(json.loads, (out / "results.jsonl").read_text().splitlines())
               if r["kind"] == "case"}
    first, tier, graphs = (records["flux2-klein-lora/ours/gc"], records["tiers/ours/sdxl-lora-12gb"],
                           records["sdxl-options/ours/cuda-graphs"])
    assert first["status"] == "ok" and first["steps_timed"] == 3 and first["planned_gib"] > 0
    assert tier["status"] == "ok" and "planned_gib" in tier and "nvml" in tier  # no NVIDIA GPU here: said so
    assert graphs["status"] == "skipped" and "CUDA device" in graphs["reason"]
    page = (out / "monitor.html").read_text()
    assert "Studio GPU monitor during tiers/ours/sdxl-lora-12gb" in page and "No NVIDIA GPU detected" in page
    if shutil.which("chromium"):
        assert tier["monitor_png"] and (out / "monitor.png").stat().st_size > 1000
    assert "planned GiB" in proc.stdout and "| flux2-klein-lora/ours/gc | ok |" in proc.stdout
