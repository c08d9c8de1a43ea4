"""Known-harmless library warnings go to train.log at DEBUG level, not to the user's console and Run page.

Each entry names the logger family and the message, and says why it is harmless; anything else a
library logs (a real warning, an error) passes unchanged. transformers and diffusers keep their own
stderr handler and do not propagate; `route_library_loggers` hands their records to the root logger,
so their real warnings reach train.log too (before, they reached only the console); Python warnings
(warnings.warn) are logged as well; torch's own handler gets the same filter."""
from __future__ import annotations

import logging
import re

# (logger name prefix, message pattern): why it is harmless
HARMLESS: dict[tuple[str, str], str] = {
    ("torchao", r"^Failed to load .*torchao/_C\w*\.[\w.-]*so"):
        "torchao's optional CUDA extensions (mxfp8, cutlass) built for other CUDA/Python versions; the weight-only "
        "int8/float8 paths the trainer uses do not need them",
    ("torchao", r"Detected no triton"):
        "torchao's triton kernels are for torch.compile; the trainer's weight-only quantization runs without them",
    ("bitsandbytes", r"Failed to load CPU gemm_4bit_forward from kernels-community"):
        "an optional faster CPU kernel from the `kernels` package; bitsandbytes falls back to its own",
    ("transformers", r"requires torchvision \(not installed\); falling back to `\w+Pil`"):
        "image processors fall back to their PIL version, which the trainer's pipelines use (torchvision is not "
        "installed on purpose)",
    ("diffusers", r"should be kept in float32: \[\]\. Casting directly"):
        "an empty list: no module of the model needs to stay in float32",
    ("diffusers", r"^Unable to import `torchao` Tensor objects"):
        "only checkpoints serialized by torchao need them; the trainer loads none",
    ("torch.utils._pytree", r"is an Enum subclass and is now natively supported by torch\.compile"):
        "torchao registers its enums the old way: a deprecation note for torchao's developers",
    ("py.warnings", r"TorchaoLoraLinear was instantiated without `get_apply_tensor_subclass`"):
        "only merge()/unmerge() need it; the trainer saves the adapters and never merges them into the base",
}
_COMPILED = [(prefix, re.compile(pattern)) for prefix, pattern in HARMLESS]


def is_harmless(record: logging.LogRecord) -> bool:
    if record.levelno >= logging.ERROR:
        return False   # errors always show
    name, message = record.name, record.getMessage()
    return any((name == prefix or name.startswith(prefix + ".")) and pattern.search(message)
               for prefix, pattern in _COMPILED)


class HideHarmless(logging.Filter):
    """For the console: drop the known-harmless warnings."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not is_harmless(record)


class DemoteHarmless(logging.Filter):
    """For train.log: keep them, at DEBUG level."""

    def filter(self, record: logging.LogRecord) -> bool:
        if is_harmless(record):
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return True


class DivertHarmless(logging.Filter):
    """For a library's own handler (torch's): drop the known-harmless, writing them to train.log at DEBUG."""

    def __init__(self, file_handler: logging.Handler | None):
        super().__init__()
        self.file_handler = file_handler

    def filter(self, record: logging.LogRecord) -> bool:
        if not is_harmless(record):
            return True
        if self.file_handler is not None:
            self.file_handler.handle(logging.makeLogRecord({**record.__dict__, "levelno": logging.DEBUG,
                                                            "levelname": "DEBUG"}))
        return False


def install(console: logging.Handler, file_handler: logging.Handler | None) -> None:
    """The filters on the trainer's two handlers; Python warnings into the log."""
    console.addFilter(HideHarmless())
    if file_handler is not None:
        file_handler.addFilter(DemoteHarmless())
    logging.captureWarnings(False)  # an earlier run in this process (tests, notebooks) left it on over a
    logging.captureWarnings(True)   # showwarning someone has replaced since: install it afresh


def route_library_loggers() -> None:
    """Let transformers' and diffusers' warnings reach the root logger's handlers (the filtered
    console, train.log) instead of their own stderr handler, and filter torch's own handler. Call
    after setup_logging, once they are imported (imports only their logging modules)."""
    import importlib
    for module in ("transformers.utils.logging", "diffusers.utils.logging"):
        try:
            hf_logging = importlib.import_module(module)
        except ImportError:
            continue
        hf_logging.disable_default_handler()
        hf_logging.enable_propagation()
    file_handler = next((h for h in logging.getLogger().handlers
                         if any(isinstance(f, DemoteHarmless) for f in h.filters)), None)
    for handler in logging.getLogger("torch").handlers:
        for old in [f for f in handler.filters if isinstance(f, DivertHarmless)]:   # an earlier run's log
            handler.removeFilter(old)
        handler.addFilter(DivertHarmless(file_handler))
