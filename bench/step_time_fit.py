"""The step-time model's fit (trainer_backend/launch/step_time.py): every GPU run the project measured, the
fitted overhead and efficiency, each run's estimate against its measurement, and the published consumer-card
figures checked against the estimate (docs/memory.md, "Step time").

    python bench/step_time_fit.py

Measurements (s/step = 1 / it/s, or s_per_step): bench/measured_h100.json (H100, 2026-11-24),
bench/measured_h200.json and bench/measured-h200-2026-11-27/call*-results.jsonl (H200). Fitted: the runs of
the GPU bench's timed protocol (5 warm-up steps, the median of 20 timed ones; docs/gpu-bench.md). Checked, not
fitted: the memory benches' timings (4 steps, the median of the 3 after the first: the same SDXL LoRA with
checkpointing measured 1.38 and 2.75 s/step in two of them). Left out: runs whose options add work the FLOP
count does not model (block swap, offloaded encoders, quantized weights) and runs the bench's time budget
cut short (status timeout)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
UNMODELED = ("memory.block_swap", "memory.offload_encoders", "model.quantize", "model.quantize_text_encoders")
# Published figures on consumer cards (not measured here): SimpleTuner's Flux.1 quickstart, LoRA with
# NF4-quantized base weights on an RTX 4090, gradient checkpointing on (its default), batch 1.
PUBLISHED = [
    {"name": "SimpleTuner Flux.1 LoRA nf4, 512²", "arch": "flux", "resolution": 512, "card": "RTX 4090",
     "sets": {"precision.gradient_checkpointing": True, "dataset.cache_latents": True}, "s_per_step": 1.4},
    {"name": "SimpleTuner Flux.1 LoRA nf4, 1024²", "arch": "flux", "resolution": 1024, "card": "RTX 4090",
     "sets": {"precision.gradient_checkpointing": True, "dataset.cache_latents": True}, "s_per_step": 3.5},
]


def _modeled(sets: dict) -> bool:
    return not any(sets.get(k) not in (None, 0, False, "none") for k in UNMODELED)


def _sets(pairs: list[str]) -> dict:
    out = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        out[key] = value == "true" if value in ("true", "false") else value.strip('"')
    return out


def measured_cases(root: Path = ROOT) -> list[dict]:
    """Every measured run the model covers: name, card, arch, resolution, sets, it_s (duplicates of one run
    in two files counted once)."""
    cases, seen = [], set()

    def add(case: dict) -> None:
        key = (case["card"], case["arch"], case["resolution"], round(case["it_s"], 4))
        if key not in seen and _modeled(case["sets"]):
            seen.add(key)
            cases.append(case)

    for c in json.loads((root / "bench" / "measured_h100.json").read_text())["cases"]:
        add({**c, "card": "H100", "protocol": "timed"})
    for c in json.loads((root / "bench" / "measured_h200.json").read_text())["cases"]:
        it_s = c.get("it_s") or (1 / c["s_per_step"] if c.get("s_per_step") else None)
        if it_s and c["name"] != "sdxl-full/ours/full-bf16":   # the call-2 row below, cut short by its budget
            add({"name": c["name"], "card": "H200", "arch": c["arch"], "resolution": c["resolution"],
                 "sets": c.get("sets", {}), "it_s": it_s,
                 "protocol": "timed" if c.get("bench") == "gpubench" else "short"})
    for path in sorted((root / "bench" / "measured-h200-2026-11-27").glob("call*-results.jsonl")):
        for row in map(json.loads, path.read_text().splitlines()):
            if row.get("kind") != "case" or row.get("status") != "ok":
                continue
            sets = _sets(row.get("sets", []))
            if row.get("method") == "full":
                sets["network.type"] = "full"
            if "--gradient_checkpointing" in row.get("example_flags", []):
                sets["precision.gradient_checkpointing"] = True
            add({"name": f"{path.stem}:{row['name']}", "card": "H200", "arch": row["model"],
                 "resolution": row["resolution"], "sets": sets, "it_s": row["it_s"], "batch": row.get("batch", 1),
                 "protocol": "timed"})
    return cases


def published_checks() -> list[tuple[str, float, float]]:
    """(name, published s/step, estimated s/step) for the published consumer-card figures."""
    from trainer_backend.launch import step_time as st
    from trainer_backend.launch.memory_tables import family_table
    return [(p["name"], p["s_per_step"], st.seconds(st._case_flops(family_table(p["arch"]), p),
                                                     st.CARD_TFLOPS[p["card"]])) for p in PUBLISHED]


def fitted(cases: list[dict]) -> list[dict]:
    return [c for c in cases if c["protocol"] == "timed"]


def main() -> int:
    from trainer_backend.launch import step_time as st
    from trainer_backend.launch.memory_tables import family_table
    cases = measured_cases()
    overhead, eff, _ = st.calibrate(family_table, fitted(cases))
    print(f"fit over {len(fitted(cases))} timed runs: overhead {overhead:.3f} s/step, efficiency {eff:.4f} "
          f"(step_time.py: {st.OVERHEAD_S}, {st.EFFICIENCY})")
    print("| run | card | fitted | measured s/step | estimated s/step | estimate / measured |\n|---|---|---|---|---|---|")
    worst = {"timed": 1.0, "short": 1.0}
    for case in cases:
        measured = 1 / case["it_s"]
        estimated = 1 / st.case_it_s(family_table(case["arch"]), case, case["card"])
        worst[case["protocol"]] = max(worst[case["protocol"]], measured / estimated, estimated / measured)
        print(f"| {case['name']} | {case['card']} | {'yes' if case['protocol'] == 'timed' else 'no'} | "
              f"{measured:.3f} | {estimated:.3f} | {estimated / measured:.2f} |")
    print(f"largest factor (step_time.py's constants): fitted runs {worst['timed']:.2f}, "
          f"memory-bench runs {worst['short']:.2f}")
    for name, published, estimated in published_checks():
        print(f"published: {name}: {published} s/step, estimated {estimated:.2f} ({estimated / published:.2f}×)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
