"""What every path the trainer or the studio reads must pass, in one place (a leaf: config/, families/,
run/ and gui/ all use it): path text the system can open (no NUL, within its length limits),
regular files only where a file is read (a FIFO would hang the reader, /dev/zero would never end),
text files read whole only up to a size cap, and links that leave an allowed folder refused.
Each check returns or raises one line naming the option (the key) and the path."""
from __future__ import annotations

import os
import stat
from pathlib import Path

from .errors import ConfigError

PATH_MAX = 4096   # bytes, Linux's limit for a whole path
NAME_MAX = 255    # bytes, for one folder or file name
TEXT_FILE_LIMIT = 4 * 1024 * 1024  # a prompt file or a config larger than this is not one


def path_text_problem(value: str) -> str | None:
    """Why this text cannot be a path on this system (None if it can)."""
    if "\x00" in value:
        return "contains a NUL character (\\x00), which no path can hold"
    try:
        encoded = os.fsencode(value)
    except UnicodeError:
        return "is not text a path can hold (a lone surrogate character)"
    if len(encoded) > PATH_MAX:
        return f"is {len(encoded):,} bytes long; a path can be at most {PATH_MAX:,}"
    longest = max((len(part) for part in encoded.split(b"/")), default=0)
    if longest > NAME_MAX:
        return f"has a name of {longest:,} bytes; a folder or file name can be at most {NAME_MAX}"
    return None


def kind_of(mode: int) -> str:
    return ("a FIFO (named pipe)" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else
            "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a regular file")


def file_kind_problem(path: Path | str, folder_ok: bool = False) -> str | None:
    """Why `path` cannot be read as a file: it is a FIFO, socket or device (reading would hang or never
    end), or a folder where a file is needed. None for a regular file (or a folder if folder_ok), and for
    a path that does not exist (the caller's own message says that)."""
    try:
        mode = os.stat(path).st_mode  # stat never opens: it cannot hang on a FIFO
    except (OSError, ValueError):
        return None
    if stat.S_ISREG(mode) or (folder_ok and stat.S_ISDIR(mode)):
        return None
    if stat.S_ISDIR(mode):
        return "is a folder, not a file"
    return f"is {kind_of(mode)}, not a regular file"


def check_readable_path(key: str, path: Path | str, folder_ok: bool = False) -> None:
    """ConfigError naming key and path when the path text or the file's kind is unusable."""
    problem = path_text_problem(str(path)) or file_kind_problem(path, folder_ok)
    if problem:
        raise ConfigError(f"{key}: {_short(path)} {problem}")


def read_text_capped(key: str, path: Path | str, limit: int = TEXT_FILE_LIMIT) -> str:
    """A UTF-8 text file read whole, only if it is a regular file of at most `limit` bytes."""
    path = Path(path).expanduser()
    check_readable_path(key, path)
    try:
        with open(path, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):  # swapped for a FIFO since the check
                raise ConfigError(f"{key}: {_short(path)} is not a regular file")
            data = f.read(limit + 1)
    except OSError as e:
        raise ConfigError(f"{key}: cannot read {_short(path)} ({e.strerror or e})") from None
    if len(data) > limit:
        raise ConfigError(f"{key}: {_short(path)} is larger than {limit // (1024 * 1024)} MB; a text file this "
                          "big is not what this option reads")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{key}: {_short(path)} is not UTF-8 text ({e.reason} at byte {e.start})") from None


def escapes(path: Path | str, root: Path | str) -> bool:
    """True when `path`, with every link resolved, is outside `root` (also resolved)."""
    try:
        real, base = Path(path).resolve(), Path(root).resolve()
    except (OSError, RuntimeError, ValueError):
        return True
    return real != base and not real.is_relative_to(base)


def _short(path: Path | str) -> str:
    text = str(path)
    return text if len(text) <= 160 else f"{text[:100]}…{text[-40:]} ({len(text):,} characters)"


# Tensors a model or LoRA file may hold as integers: buffers, never weights. A weight relabelled
# F32 -> I32 keeps its size (the header still adds up) and would train on garbage.
INTEGER_DTYPES = {"I16", "I32", "I64", "U16", "U32", "U64", "BOOL"}   # U8/I8: packed formats, refused by name
INTEGER_BUFFERS = ("position_ids", "num_batches_tracked", "_step_count")


def integer_weight(dtypes: dict[str, str]) -> tuple[str, str] | None:
    """(name, dtype) of the first tensor stored as integers that is not a known integer buffer, from a
    safetensors header's dtypes ("F32", "I32", …); None when every weight is floating point."""
    for name, dtype in dtypes.items():
        if dtype.upper() in INTEGER_DTYPES and not name.endswith(INTEGER_BUFFERS):
            return name, dtype
    return None


def dtype_code(dtype) -> str:
    """A torch dtype in safetensors' spelling (torch.int32 -> "I32", torch.bool -> "BOOL"); floats -> "F"."""
    name = str(dtype).rsplit(".", 1)[-1]
    if name.startswith(("float", "bfloat", "complex")):
        return "F"
    return {"bool": "BOOL"}.get(name, name.replace("uint", "U").replace("int", "I").upper())


def check_float_weights(key: str, path: Path | str, dtypes: dict[str, str]) -> None:
    """ConfigError naming the option, the file and the tensor when a weight is stored as integers."""
    found = integer_weight(dtypes)
    if found:
        raise ConfigError(f"{key}: {_short(path)}: tensor {found[0]} is {found[1]}, but weights are floating-point "
                          "numbers; the file is damaged or mislabelled")
