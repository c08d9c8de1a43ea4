"""What loading a model from the separate files ComfyUI users keep needs, whatever the family
(Flux's flux/components.py, SD3's sd3/components.py): the bundled full-size configs, a file's own
config (written by this project's exports), a key-by-key check of a file against the architecture
before anything loads (one line naming the option, the file and the first key that does not fit),
reading only the tensors under one prefix of a large all-in-one file, and assigning them to a
module built on the meta device; and the other direction, a transformer written as one such file."""
from __future__ import annotations

import json
import os
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path

from ..errors import ConfigError

META_CONFIG = "sd_studio.config"  # a component's own config (JSON), written by this project's exports


def bundled(family: str, name: str) -> dict:
    """assets/model_configs/<family>/<name> without its `_note`."""
    from .sd.loader import ASSETS_CONFIGS
    path = ASSETS_CONFIGS / family / name
    return {k: v for k, v in json.loads(path.read_text()).items() if k != "_note"}


def header(option: str, path: Path) -> tuple[dict[str, tuple], dict[str, str]]:
    """(weight name -> shape, metadata) of a file, without reading its weights."""
    from .sd.single_file import read_keys_and_metadata
    if not path.is_file():
        raise ConfigError(f"{option}: {path} does not exist")
    try:
        return read_keys_and_metadata(path)
    except ConfigError as e:
        raise ConfigError(f"{option}: {str(e).split(': ', 1)[1]}") from None


def own_config(metadata: dict[str, str], fallback: dict, key: str = META_CONFIG) -> dict:
    try:
        return json.loads(metadata[key]) if key in metadata else fallback
    except json.JSONDecodeError:
        return fallback


def with_article(noun: str) -> str:
    """"a Flux", "an SD3": the article as the name is spoken (S-D, not "sd")."""
    return ("an " if noun.startswith(("SD", "A", "E", "I", "O", "U")) else "a ") + noun


def check(option: str, path: Path, shapes: dict, expected: dict, what: str) -> None:
    """Every expected weight present with its shape; else one line naming the first that is not."""
    what = with_article(what)
    for key, shape in expected.items():
        if key not in shapes:
            raise ConfigError(f"{option}: {path.name} is not {what}: it has no {key}")
        if tuple(shapes[key]) != tuple(shape):
            raise ConfigError(f"{option}: {path.name} is not {what}: {key} is {list(shapes[key])}, "
                              f"expected {list(shape)}")


def load_into(option: str, path: Path, module, state: dict, skip=()) -> None:
    """Assign the file's tensors (as fp32) to a module built on the meta device. Always copies: a fused
    weight's parts split from an fp32 file are views at odd offsets, and matmuls on those differ from a
    folder-loaded model's in the last bit."""
    import torch
    missing, _ = module.load_state_dict({k: v.to(torch.float32, copy=True) for k, v in state.items()},
                                        strict=False, assign=True)
    missing = [k for k in missing if k not in skip]
    if missing:
        raise ConfigError(f"{option}: {path.name} has no {missing[0]}")


def load_checked(option: str, path: Path, module, what: str, shapes: dict, expected: dict, convert=None,
                 skip=(), prefix: str = "", keys=None) -> None:
    """The common path of a component file: its `shapes` (names as `module` has them) checked against
    `expected` first (one line naming the first key that does not fit), then its tensors read (those
    under `prefix`, only `keys` if given: see read_prefixed), renamed by `convert` (the file's state
    -> the module's; None: as they are) and assigned to `module` (built on the meta device)."""
    check(option, path, shapes, expected, what)
    state = read_prefixed(path, prefix, keys)
    load_into(option, path, module, convert(state) if convert is not None else state, skip)


# ComfyUI's fp8 files: each Linear weight a float8 with its scale beside it (per tensor or per row)
FP8_SCALES = (".weight_scale", ".scale_weight")  # the current name, the older "scaled_fp8" files' name


def dequantize_fp8(state: dict) -> dict:
    """The tensors with each scaled fp8 weight as weight × scale (fp32); scales stay (callers drop them)."""
    import torch
    out = dict(state)
    for name, scale in state.items():
        if name.endswith(FP8_SCALES):
            weight = name.rsplit(".", 1)[0] + ".weight"
            w, scale = state[weight].to(torch.float32), scale.to(torch.float32)
            out[weight] = w * (scale.reshape(-1, *[1] * (w.dim() - 1)) if scale.numel() > 1 else scale)
    return out


FP8_DTYPES = ("F8_E4M3", "F8_E5M2")
AUX_SUFFIXES = (".input_scale", ".comfy_quant", "scaled_fp8")  # ComfyUI's quantization markers: not weights


def stream_into(option: str, path: Path, module, convert_one, expected: dict, what: str, *, prefix: str = "",
                dtype=None, optional=(), progress=None, float8=frozenset()) -> None:
    """Load a file into `module` (built on the meta device) one tensor at a time, never the whole model
    at once: each tensor is read, an fp8 weight multiplied by its scale (per tensor or per row) in fp32,
    cast to `dtype` and assigned before the next is read, so the peak is the loaded model plus one
    tensor. `dtype` None: bfloat16 for a file whose weights are fp8 (what they were quantized from),
    else float32 (the family contract). `convert_one(name, tensor) -> {module key: tensor}` renames (and
    splits fused weights); the file's names (after `prefix`, through convert_one on meta shapes) are
    checked against `expected` first: one line naming the option, the file and the first key that does
    not fit. `optional`: module keys a file may leave out (filled with zeros). `progress(name)` after
    each tensor. `float8`: module keys of Linear weights stored as model.quantize = float8 stores them
    (stored_float8): an e4m3 weight keeps its bytes and scale, any other is quantized as it arrives."""
    import torch
    from safetensors import safe_open
    with safe_open(str(path), framework="pt") as f:
        names = [n for n in f.keys() if n.startswith(prefix) and not n.endswith(AUX_SUFFIXES + FP8_SCALES)]
        kinds = {n: f.get_slice(n).get_dtype() for n in names}
        shapes = {}
        for n in names:
            meta = torch.empty(f.get_slice(n).get_shape(), device="meta")
            shapes.update({k: tuple(v.shape) for k, v in convert_one(n[len(prefix):], meta).items()})
        check(option, path, shapes, {k: v for k, v in expected.items() if k not in optional}, what)
        if dtype is None:
            dtype = torch.bfloat16 if any(kinds[n] in FP8_DTYPES for n in names) else torch.float32
        scales = set(f.keys())
        done = set()
        for n in names:
            t = f.get_tensor(n)
            scale = next((n.rsplit(".", 1)[0] + s for s in FP8_SCALES if n.rsplit(".", 1)[0] + s in scales), None)
            s = f.get_tensor(scale).to(torch.float32) if scale is not None and kinds[n] in FP8_DTYPES else None
            if s is not None and s.numel() not in (1, t.shape[0]):
                raise ConfigError(f"{option}: {path.name} scales {n} by blocks ({scale} is {list(s.shape)}); only "
                                  "fp8 files scaled per tensor or per row are read")
            for key, value in _converted(n[len(prefix):], t, s, kinds[n], convert_one, float8, dtype).items():
                if key in expected:
                    _assign(module, key, value)
                    done.add(key)
            del t, s
            if progress is not None:
                progress(n)
    for key in optional:
        if key in expected and key not in done:
            if key in float8:  # zeros in float8 storage too: a left-out part never exists in bf16 either
                from ..compute.quantize import float8_rows
                zeros = torch.zeros(expected[key], dtype=torch.float8_e4m3fn)
                _assign(module, key, float8_rows(zeros, torch.ones(expected[key][0]), dtype))
            else:
                _assign(module, key, torch.zeros(expected[key], dtype=dtype))
    left = [k for k in expected if k not in done and k not in optional]
    if left:
        raise ConfigError(f"{option}: {path.name} has no {left[0]}")


def stream_transformer(model_class, option: str, path: Path, config: dict, convert_one, what: str, published: str,
                       dtype=None):
    """A transformer file (bf16, fp32 or scaled fp8) as `model_class`: built on the meta device from the
    file's own config (else `config`), packed formats refused naming `published` (the files to use), then
    read one tensor at a time through `convert_one` (stream_into), checked key by key."""
    _, metadata = header(option, path)
    with weights_on_meta():
        model = model_class.from_config(own_config(metadata, config))
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    refuse_packed(option, path, published)
    stream_into(option, path, model, convert_one, expected, what, dtype=dtype, float8=stored_float8(model))
    return model


_STORAGE: ContextVar[tuple[dict, tuple]] = ContextVar("frozen_storage", default=({}, ()))


@contextmanager
def frozen_storage(kind: str, keep=(), text_encoders: str = "none"):
    """While a model loads for a run whose frozen base model.quantize stores as `kind` (the family keeping
    `keep` unquantized) and whose text encoders model.quantize_text_encoders stores as `text_encoders`: the
    readers that stream a file (stream_transformer, qwen3vl_file) store the Linear weights compute/quantize.py
    would quantize in that storage as they arrive (float8 only), so the whole model never exists in bf16 first."""
    token = _STORAGE.set(({"denoiser": kind, "text_encoder": text_encoders}, tuple(keep)))
    try:
        yield
    finally:
        _STORAGE.reset(token)


def stored_float8(model, part: str = "denoiser") -> set[str]:
    """The weights (module keys) of `model` (the `part`: "denoiser" or "text_encoder") to store as float8 in
    this load (frozen_storage), else none."""
    kinds, keep = _STORAGE.get()
    if kinds.get(part) != "float8":
        return set()
    from ..compute.quantize import quantizable_linears
    return {f"{name}.weight" for name in quantizable_linears(model, keep)}


def _converted(name: str, t, scale, kind: str, convert_one, float8, dtype) -> dict:
    """One file tensor as the module's tensor(s) (convert_one), ready to assign: an fp8 weight × its scale
    (per tensor or per row) in fp32, cast to `dtype`; a weight in `float8` in torchao's float8 storage, an
    e4m3 one keeping its bytes and scale where convert_one only renames or splits its rows."""
    import torch
    from ..compute.quantize import float8_from, float8_rows
    out = {}
    if kind == "F8_E4M3" and t.dim() == 2 and float8:
        rows = (scale if scale is not None else torch.ones(())).reshape(-1, 1).expand(t.shape)
        row_scales = convert_one(name, rows)  # the rows of the scale follow the rows of the weight
        parts = convert_one(name, t)
        for key, q in parts.items():
            r = row_scales.get(key)
            if key in float8 and r is not None and r.shape == q.shape and q.dim() == 2 \
                    and torch.equal(r, r[:, :1].expand(r.shape)):
                # a copy: the file's tensors are its memory map, which must not outlive the read
                out[key] = float8_rows(q.clone(), r[:, 0].clone(), dtype)
        if len(out) == len(parts):
            return out
    if kind in FP8_DTYPES and scale is not None:
        t = t.to(torch.float32) * (scale.reshape(-1, *[1] * (t.dim() - 1)) if scale.numel() > 1 else scale)
    for key, value in convert_one(name, t).items():
        if key not in out:
            # quantized from the file's own precision (as quantize_ does from a bf16 file in a bf16 run)
            out[key] = float8_from(value, dtype if kind in FP8_DTYPES else value.dtype) if key in float8 \
                else value.to(dtype, copy=True)
    return out


def _assign(module, key: str, value) -> None:
    """One parameter or buffer of `module` replaced by `value` (its meta placeholder dropped)."""
    import torch
    owner, _, leaf = key.rpartition(".")
    sub = module.get_submodule(owner) if owner else module
    if leaf in sub._parameters:
        sub._parameters[leaf] = torch.nn.Parameter(value, requires_grad=sub._parameters[leaf].requires_grad)
    else:
        sub._buffers[leaf] = value


def refuse_packed(option: str, path: Path, use: str) -> None:
    """A quantized format other than fp8 (packed 4-bit or integer weights, ComfyUI's nvfp4/int8 files):
    one line naming the file, before the shape check would name a confusing shape."""
    from safetensors import safe_open
    with safe_open(str(path), framework="pt") as f:
        for name in f.keys():
            if name.endswith(".weight") and f.get_slice(name).get_dtype() in ("U8", "I8", "F4", "F8_E8M0"):
                raise ConfigError(f"{option}: {path.name} holds packed or integer weights ({name} is "
                                  f"{f.get_slice(name).get_dtype()}), a quantized format only ComfyUI's kernels "
                                  f"read; use the bf16 or fp8 file ({use})")


def weights_on_meta():
    """Parameters on the meta device (no memory, no init), buffers (position ids) real."""
    from accelerate import init_empty_weights
    return init_empty_weights(include_buffers=False)


def strip(state: dict, prefixes: tuple[str, ...]) -> dict:
    """The entries under the first of `prefixes` the dict has, without it (else the dict unchanged)."""
    for p in prefixes:
        if any(k.startswith(p) for k in state):
            return {k[len(p):]: v for k, v in state.items() if k.startswith(p)}
    return state


def read_prefixed(path: Path, prefix: str = "", keys=None) -> dict:
    """The tensors of a .safetensors file under `prefix` (prefix removed), or only `keys` (names after
    the prefix): an all-in-one checkpoint is read one component at a time."""
    from safetensors import safe_open
    out = {}
    with safe_open(str(path), framework="pt") as f:
        for name in f.keys():
            if name.startswith(prefix):
                short = name[len(prefix):]
                if keys is None or short in keys:
                    out[short] = f.get_tensor(name)
    return out


def find_tokenizers(folder: str, subs: tuple[str, ...], hf_cache: list[list[tuple[str, str]]], label: str) -> list:
    """One tokenizer per sub-folder name in `subs`: from model.tokenizer (a diffusers folder of the
    family), else the local Hugging Face cache (`hf_cache[i]`: (repo, subfolder) pairs, never fetched)."""
    from transformers import AutoTokenizer
    found = []
    for slot, sub in enumerate(subs):
        candidates = [Path(folder).expanduser() / sub] if folder else []
        candidates += hf_cache_folders(hf_cache[slot])
        tok = None
        for c in candidates:
            if c.is_dir() and any((c / f).is_file() for f in ("tokenizer.json", "vocab.json", "spiece.model")):
                tok = AutoTokenizer.from_pretrained(str(c), local_files_only=True)
                break
        if tok is None:
            raise ConfigError(f"model.tokenizer: {label} single files hold no tokenizers; set model.tokenizer to a "
                              f"{label} diffusers folder (with {'/, '.join(subs)}/); no {sub}/ found"
                              + (f" in {folder}" if folder else " (and none in the Hugging Face cache)"))
        found.append(tok)
    return found


def tokenizer_folders(folder: str, hf_cache: list[tuple[str, str]], files: tuple[str, ...]):
    """Folders holding one of `files`, in the order a single-file model looks for its tokenizer:
    model.tokenizer's tokenizer/ sub-folder, model.tokenizer itself, then the local Hugging Face cache."""
    candidates = []
    if folder:
        root = Path(folder).expanduser()
        candidates += [root / "tokenizer", root]
    candidates += hf_cache_folders(hf_cache)
    return [c for c in candidates if c.is_dir() and any((c / f).is_file() for f in files)]


def find_qwen3_tokenizer(folder: str, hf_cache: list[tuple[str, str]], label: str):
    """The Qwen3 tokenizer of a single-file model (Flux.2, Z-Image: `label`): from model.tokenizer (the
    family's diffusers folder with tokenizer/, or a tokenizer folder itself), else the local Hugging Face
    cache (`hf_cache`: (repo, subfolder) pairs, never fetched)."""
    from transformers import AutoTokenizer
    for c in tokenizer_folders(folder, hf_cache, ("tokenizer.json", "vocab.json")):
        return AutoTokenizer.from_pretrained(str(c), local_files_only=True)
    raise ConfigError(f"model.tokenizer: {label} single files hold no tokenizer; set model.tokenizer to a {label} "
                      "diffusers folder (with tokenizer/) or a Qwen3 tokenizer folder"
                      + (f"; none found in {folder}" if folder else " (none in the Hugging Face cache either)"))


def hf_cache_folders(repos: list[tuple[str, str]]) -> list[Path]:
    """The tokenizer folders of (repo, subfolder) pairs present in the local Hugging Face cache (never fetched)."""
    from huggingface_hub import try_to_load_from_cache
    cache_dir = os.environ.get("HF_HUB_CACHE") or (
        os.path.join(os.environ["HF_HOME"], "hub") if os.environ.get("HF_HOME") else None)
    out = []
    for repo, sub in repos:
        hit = try_to_load_from_cache(repo, f"{sub}/tokenizer_config.json" if sub else "tokenizer_config.json",
                                     cache_dir=cache_dir)
        if isinstance(hit, str):
            out.append(Path(hit).parent)
    return out


VAE_PREFIXES = ("first_stage_model.", "vae.")  # SD/SD3 checkpoints; ComfyUI's Flux checkpoints


def embedded_vae_prefix(shapes: dict) -> str | None:
    """The prefix an all-in-one checkpoint keeps its autoencoder under (None: it has none)."""
    return next((p for p in VAE_PREFIXES if any(k.startswith(p) for k in shapes)), None)


def load_original_vae(option: str, source: Path, shapes: dict, config: dict, what: str):
    """An AutoencoderKL from original-layout (`encoder.down.0.block.0…`) weights in `source`, under a
    VAE_PREFIXES prefix or none, checked key by key first; diffusers' converter maps the names."""
    import torch
    from diffusers import AutoencoderKL
    from diffusers.loaders.single_file_utils import convert_ldm_vae_checkpoint
    from .sd.ldm_keys import VAE_PREFIX, vae_to_ldm
    with weights_on_meta():
        vae = AutoencoderKL.from_config(config)
    expected = {k[len(VAE_PREFIX):]: tuple(v.shape) for k, v in vae_to_ldm(vae.state_dict(), config).items()}
    prefix = embedded_vae_prefix(shapes) or ""
    check(option, source, {k[len(prefix):]: v for k, v in shapes.items() if k.startswith(prefix)}, expected, what)
    state = convert_ldm_vae_checkpoint(read_prefixed(source, prefix, keys=set(expected)), config)
    load_into(option, source, vae, state)
    return vae.to(torch.float32)


def transformer_from_file(path: str | Path, like, to_diffusers):
    """A copy of the transformer `like` with the weights of a single file, whose keys `to_diffusers` turns
    into diffusers' names (a family's converter)."""
    import copy
    from safetensors.torch import load_file
    model = copy.deepcopy(like)
    model.load_state_dict(to_diffusers(load_file(str(path))))
    return model


def save_transformer_file(transformer, out_file: str | Path, convert=None, dtype=None,
                          metadata: dict[str, str] | None = None) -> Path:
    """The transformer alone as one `.safetensors` file, written atomically: its weights through
    `convert` (diffusers names -> the file's layout; None keeps diffusers' names), cast to `dtype`,
    and its config in the metadata (META_CONFIG), so sizes the bundled configs do not know load back."""
    from safetensors.torch import save_file
    state = {k: v.detach() for k, v in transformer.state_dict().items()}
    if any("lora_" in k or ".base_layer." in k for k in state):
        raise ValueError("the model still has adapter layers; merge them (merge_and_unload) before export")
    out = convert(state) if convert is not None else state
    if dtype is not None:
        out = {k: v.to(dtype) for k, v in out.items()}
    path = Path(out_file)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".partial")
    config = json.dumps({k: v for k, v in transformer.config.items() if not k.startswith("_")})
    save_file({k: v.contiguous() for k, v in out.items()}, str(tmp),
              metadata={"format": "pt", META_CONFIG: config, **(metadata or {})})
    os.replace(tmp, path)
    return path
