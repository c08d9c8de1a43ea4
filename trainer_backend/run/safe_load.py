"""Checkpoint files read without running code.

A pickle can name any Python callable and have the unpickler call it; a checkpoint copied from a
shared bucket or another machine must not be able to do that. So:
- the trainer's own state is JSON (`trainer_state.json`, `lr_scheduler.json`) and the weights are
  safetensors: formats that carry only data;
- what accelerate and torch write as pickles (optimizer state, RNG states, a GradScaler, a
  sampler, an older checkpoint's `custom_checkpoint_0.pkl`) is read only by torch's
  `weights_only` unpickler, which builds tensors, numbers, strings and containers and refuses any
  other global, plus the exact few numpy names an RNG state needs (ALLOWED_GLOBALS);
- every file of a checkpoint folder is checked that way before anything of it is loaded
  (`check_checkpoint_files`), and while accelerate loads it every `torch.load` is forced to
  `weights_only` (`tensors_only`), whatever its caller asked for.
A file that needs anything else is refused with one line naming it.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import threading
import warnings
import zipfile
from pathlib import Path
from typing import Any, Iterator

from ..errors import ConfigError

JSON_SUFFIXES = (".json",)
# DeepSpeed's checkpoint: `latest` names the tag folder (text); it copies its conversion scripts in
# for the user (never imported or run by a resume)
TAG_FILES = ("latest",)
SCRIPT_FILES = ("zero_to_fp32.py", "zero_to_torch.py")
SAFETENSORS_SUFFIXES = (".safetensors",)
FORCE_ENV = "TORCH_FORCE_WEIGHTS_ONLY_LOAD"  # torch.load reads it at each call
_ENV_LOCK = threading.Lock()


class UnsafeCheckpointError(ConfigError):
    """A checkpoint file that cannot be read without running code (or cannot be read at all)."""


def allowed_globals() -> list:
    """The exact non-torch names a checkpoint's pickles may use: numpy arrays and dtypes (the numpy
    RNG state in random_states_N.pkl) and codecs.encode (how pickle protocol 2 writes bytes)."""
    import codecs

    import numpy as np
    try:
        from numpy._core.multiarray import _reconstruct
    except ImportError:  # numpy 1.x
        from numpy.core.multiarray import _reconstruct
    names: list = [_reconstruct, np.ndarray, np.dtype, codecs.encode]
    names += [getattr(np.dtypes, n) for n in ("UInt32DType", "Int64DType", "Float64DType", "Float32DType",
                                              "BoolDType") if hasattr(np, "dtypes") and hasattr(np.dtypes, n)]
    if "deepspeed" in sys.modules:  # a DeepSpeed run: its optimizer files hold three plain records
        from deepspeed.runtime.fp16.loss_scaler import LossScaler
        from deepspeed.runtime.zero.config import ZeroStageEnum
        from deepspeed.utils.tensor_fragment import fragment_address
        names += [LossScaler, ZeroStageEnum, fragment_address]
    return names


def _reason(error: BaseException) -> tuple[bool, str]:
    """(refused for what it holds, the line of torch's message that says what), never torch's advice
    to load the file with weights_only=False."""
    text = str(error)
    for line in text.splitlines():
        line = line.strip()
        if "Unsupported" in line or "GLOBAL" in line:
            line = line.split("WeightsUnpickler error:")[-1].split(" was not an allowed global")[0]
            return True, line.split(". Please")[0].strip().rstrip(".")
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    return False, f"{type(error).__name__}: {first[:200]}" if first else type(error).__name__


def load_pickled(path: Path, map_location: Any = "cpu", key: str = "",
                 what: str = "a checkpoint never needs code to load") -> Any:
    """A torch-saved file through the weights_only unpickler and ALLOWED_GLOBALS; anything else is
    an UnsafeCheckpointError naming the file (and `key`, the option that named it, if given)."""
    import torch
    path = Path(path)
    mmap = zipfile.is_zipfile(path)  # the checks need only the pickle, not the tensor data
    try:
        with torch.serialization.safe_globals(allowed_globals()), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Detected pickle protocol 4": the unpickler reads it
            return torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except Exception as e:
        unsafe, reason = _reason(e)
        prefix = f"{key}: " if key else ""
        if unsafe:
            raise UnsafeCheckpointError(f"{prefix}{path}: refused, this file needs more than tensors and plain "
                                        f"values to load ({reason}); {what}, so it was not loaded") from None
        raise UnsafeCheckpointError(f"{prefix}{path}: not a readable torch file ({reason})") from None


def read_json(path: Path) -> Any:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise UnsafeCheckpointError(f"{path}: not readable JSON ({e})") from None


def check_checkpoint_files(folder: Path) -> list[Path]:
    """Every file under a checkpoint folder is JSON, safetensors, or a pickle the weights_only
    unpickler reads with ALLOWED_GLOBALS; the first one that is not is an UnsafeCheckpointError.
    Links are refused (a checkpoint holds its own files). Returns the files checked."""
    from safetensors import safe_open
    checked = []
    for path in sorted(Path(folder).rglob("*")):
        if path.is_symlink():
            raise UnsafeCheckpointError(f"{path}: refused, a checkpoint holds its own files, not links")
        if path.is_dir():
            continue
        if not path.is_file():
            raise UnsafeCheckpointError(f"{path}: refused, not a regular file")
        if path.name.endswith(JSON_SUFFIXES):
            read_json(path)
        elif path.name in SCRIPT_FILES and path.parent == Path(folder):
            pass
        elif path.name in TAG_FILES:
            if path.stat().st_size > 256 or not re.fullmatch(r"[\w.\-]+\s*", path.read_text(errors="replace")):
                raise UnsafeCheckpointError(f"{path}: refused, not a checkpoint tag (one short name)")
        elif path.name.endswith(SAFETENSORS_SUFFIXES):
            try:
                with safe_open(str(path), framework="pt"):
                    pass
            except Exception as e:
                raise UnsafeCheckpointError(f"{path}: not a readable safetensors file ({e})") from None
        else:
            load_pickled(path)
        checked.append(path)
    return checked


@contextlib.contextmanager
def tensors_only() -> Iterator[None]:
    """Every torch.load in this process, while inside, uses the weights_only unpickler (with
    ALLOWED_GLOBALS), even where the caller asked for weights_only=False (accelerate's custom
    state, DeepSpeed's checkpoint engine)."""
    import torch
    with _ENV_LOCK:
        before = os.environ.get(FORCE_ENV)
        os.environ[FORCE_ENV] = "1"
        try:
            with torch.serialization.safe_globals(allowed_globals()):
                yield
        finally:
            if before is None:
                os.environ.pop(FORCE_ENV, None)
            else:
                os.environ[FORCE_ENV] = before
