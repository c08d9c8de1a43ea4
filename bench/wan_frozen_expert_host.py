"""Host memory of a Wan 2.2 two-expert load and placement with the frozen expert (model.expert high/low) stored
as the run's model.quantize, each mode in a fresh process (peaks do not mix).

    .venv/bin/python bench/wan_frozen_expert_host.py [--dim 1024] [--layers 8] [--quantize int8]

A random Wan 2.2 T2V folder is written with both experts `--dim` wide and `--layers` deep (the tiny model scaled;
the defaults give 0.13 B parameters per expert, 0.54 GB in fp32). Its frozen expert counts as a full-size one
(read in bf16: FROZEN_EXPERT_BF16_BYTES is set to 0 in the child). Each mode reports the peak resident set of
the load and after the run's placement on the CPU, and the frozen expert's own bytes as stored, as anonymous resident memory (RssAnon, sampled every 2 ms:
the tensors, not the weight files' memory-mapped pages; freed heap returned with malloc_trim before each
reading), over the process's before the load (imports excluded):
- bf16 frozen: model.quantize none;
- quantized: model.quantize KIND: the frozen expert, read in bf16, is quantized when the denoiser is placed
  (training/sampling_residency.py), as the trained expert's base is.
On a CPU "placement" keeps everything in this process's memory, the trained expert included (quantized too in
the second mode), so the after-placement figure is not a GPU run's host memory (docs/video.md has those). The
load's peak is the frozen expert's bf16 copy (the fp32 trained expert and text encoder stay memory-mapped file
pages until they are cast or moved): quantizing after the load does not lower it.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import ctypes, gc, json, sys, threading, time, types
import torch
from trainer_backend.families import load_model
from trainer_backend.families.wan import family as wan_family
from trainer_backend.config import load_config
from trainer_backend.training.setup import place_model
folder, quantize = sys.argv[1], sys.argv[2]
wan_family.FROZEN_EXPERT_BF16_BYTES = 0
libc = ctypes.CDLL("libc.so.6")

def anon():  # anonymous resident memory: the tensors, not the weight files' memory-mapped pages
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024

def settled():  # freed heap memory back to the system first (glibc keeps it otherwise)
    gc.collect(); libc.malloc_trim(0)
    return anon()

peak, running = [0], [True]
def sample():
    while running[0]:
        peak[0] = max(peak[0], anon()); time.sleep(0.002)
before = settled()
thread = threading.Thread(target=sample); thread.start()
model = load_model(folder, model_options={"expert": "low"})
running[0] = False; thread.join()
cfg = load_config(None, [f"model.path={folder}", "hardware.cpu=true", "precision.mixed=bf16",
                         f"model.quantize={quantize}", "model.expert=low"])
place_model(model, cfg, types.SimpleNamespace(device=torch.device("cpu")))
from trainer_backend.compute.quantize import weight_bytes
print(json.dumps({"load_peak": peak[0] - before, "after_placement": settled() - before,
                  "frozen": weight_bytes(model.options["other_expert"])}))
"""

def build(folder: Path, dim: int, layers: int) -> None:
    import torch
    from diffusers import WanPipeline, WanTransformer3DModel
    from transformers import AutoTokenizer
    from trainer_backend.families.tiny_t5 import write_t5_tokenizer
    from trainer_backend.families.wan.tiny import Z_DIM, tiny_components
    parts = tiny_components(seed=0)
    for name in ("transformer", "transformer_2"):
        parts[name] = WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=dim // 64, attention_head_dim=64,
                                            in_channels=Z_DIM, out_channels=Z_DIM, text_dim=32, freq_dim=32,
                                            ffn_dim=4 * dim, num_layers=layers, rope_max_seq_len=32)
    tok = write_t5_tokenizer(folder / "tokenizer", model_max_length=64)
    with torch.no_grad():
        WanPipeline(tokenizer=AutoTokenizer.from_pretrained(tok), **parts).save_pretrained(folder)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dim", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--quantize", default="int8", choices=["int8", "float8", "nf4"])
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "wan"
        build(folder, args.dim, args.layers)
        size = sum(f.stat().st_size for f in (folder / "transformer").glob("*.safetensors"))
        print(f"each expert: {size / 1e9:.2f} GB on disk (fp32)")
        modes = {"bf16 frozen": "none", "quantized": args.quantize}
        results = {}
        for label, quant in modes.items():
            out = subprocess.run([sys.executable, "-c", CHILD, str(folder), quant], cwd=ROOT,
                                 capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
            results[label] = json.loads(out)
        base = results["bf16 frozen"]
        for label, r in results.items():
            print(f"{label:24s} load peak {r['load_peak'] / 1e9:6.3f} GB ({r['load_peak'] / base['load_peak']:.2f}x)  "
                  f"after placement {r['after_placement'] / 1e9:6.3f} GB "
                  f"({r['after_placement'] / base['after_placement']:.2f}x)  frozen expert {r['frozen'] / 1e9:.3f} GB "
                  f"({r['frozen'] / base['frozen']:.2f}x)")


if __name__ == "__main__":
    main()
