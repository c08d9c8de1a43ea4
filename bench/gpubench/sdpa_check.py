"""Which attention kernel is right at a model's shapes: forward and backward of
`scaled_dot_product_attention` per backend, each in its own process (an illegal memory access
ends the CUDA context), against an fp32 math reference.

    python3 bench/gpubench/sdpa_check.py [--shape flux]

Prints one line per backend and, last, `GPUBENCH_SDPA=...`: the backends that passed, for
`observe.py` (empty when the default passed, so nothing changes).
Written after full-size Flux.1 LoRA on an H200 (torch 2.11+cu130) failed in both programs with
PyTorch's default kernel choice (cuDNN's, at these shapes): an illegal memory access in the example,
a NaN loss at step 2 in ours. Here, on the same machine, every kernel passed this isolated check
(errors ~4e-3, bf16's), so the failure needs more than the shape; with cuDNN's kernel off, our run
trained 19 steps with finite, falling losses. Hence precision.attention = "sdpa" leaves cuDNN out.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys

SHAPES = {  # batch, heads, tokens, head dim: Flux.1 at 1024² (4096 image + 512 T5 tokens), SDXL's largest
    "flux": (1, 24, 4608, 128),
    "sdxl": (1, 10, 4096, 64),
}
BACKENDS = ("default", "cudnn", "flash", "efficient")


def one(backend: str, shape: tuple[int, ...], device: str = "cuda") -> dict:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    b, h, n, d = shape
    gen = torch.Generator(device=device).manual_seed(0)
    # the models' layout: (batch, tokens, heads, dim) transposed, so the kernels see strided inputs
    q, k, v, g = (torch.randn(b, n, h, d, device=device, generator=gen).transpose(1, 2) for _ in range(4))
    leaves = [t.to(torch.bfloat16).requires_grad_() for t in (q, k, v)]
    kinds = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
             "efficient": SDPBackend.EFFICIENT_ATTENTION}
    ctx = sdpa_kernel([kinds[backend]]) if backend in kinds else contextlib.nullcontext()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA if device == "cuda" else torch.profiler.ProfilerActivity.CPU]) as prof, ctx:
        out = F.scaled_dot_product_attention(*leaves)
        out.backward(g.to(torch.bfloat16))
        if device == "cuda":
            torch.cuda.synchronize()
    kernels = sorted({e.key[:60] for e in prof.key_averages()
                      if any(w in e.key.lower() for w in ("attention", "fmha", "flash", "cudnn"))})
    ref = [t.detach().double().requires_grad_() for t in (q, k, v)]
    with sdpa_kernel([SDPBackend.MATH]):
        ref_out = F.scaled_dot_product_attention(*ref)
        ref_out.backward(g.to(torch.bfloat16).double())

    def rel(a, b):
        return float((a.double() - b).norm() / b.norm())
    errs = {"out": rel(out, ref_out.detach()), **{f"d{x}": rel(t.grad, r.grad) for x, t, r in zip("qkv", leaves, ref)}}
    finite = all(torch.isfinite(t.grad).all().item() for t in leaves) and torch.isfinite(out).all().item()
    return {"backend": backend, "ok": finite and max(errs.values()) < 2e-2, "errors": errs, "kernels": kernels}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="flux")
    ap.add_argument("--one", default="")
    ap.add_argument("--device", default="cuda", help="cpu: a check of this script, with --tokens small")
    ap.add_argument("--tokens", type=int, default=0, help="override the shape's token count")
    args = ap.parse_args()
    shape = SHAPES[args.shape]
    if args.tokens:
        shape = (*shape[:2], args.tokens, shape[3])
    if args.one:
        print("SDPA " + json.dumps(one(args.one, shape, args.device)), flush=True)
        return
    passed = {}
    for backend in BACKENDS:
        proc = subprocess.run([sys.executable, __file__, "--shape", args.shape, "--one", backend,
                               "--device", args.device, "--tokens", str(shape[2])],
                              capture_output=True, text=True, timeout=300)
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("SDPA ")), None)
        result = json.loads(line[5:]) if line else {"backend": backend, "ok": False,
                                                    "failure": (proc.stderr.strip().splitlines() or ["?"])[-1]}
        passed[backend] = result["ok"]
        print(json.dumps(result), flush=True)
    good = [b for b in ("flash", "efficient", "cudnn") if passed.get(b)]
    print("GPUBENCH_SDPA=" + ("" if passed.get("default") else ",".join(good + ["math"])))


if __name__ == "__main__":
    main()
