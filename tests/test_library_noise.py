"""Library noise out of the user's log (issue 29 item 12): a tiny run's console and train.log start
without torchao's "Failed to load … _C_mxfp8", "Detected no triton", bitsandbytes' kernels-community
line or transformers' torchvision fallback; the optional back-ends load only for the options that use
them; known-harmless lines go to train.log at DEBUG; a real warning still shows."""
from __future__ import annotations

import logging
import os
import subprocess
import sys
import warnings
from pathlib import Path

from trainer_backend.config import from_dict, save_toml, to_dict
from trainer_backend.training.optional_backends import needed_backends

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
NOISE = ("Failed to load", "_C_mxfp8", "Detected no triton", "kernels-community", "requires torchvision",
         "Unable to import `torchao`", "should be kept in float32")


def _shown(log_text: str) -> str:
    """train.log as the Run page shows it (DEBUG records left out)."""
    from gui.run_monitor import without_debug
    return "\n".join(without_debug(log_text.splitlines()))


def test_a_tiny_run_logs_no_library_noise_and_imports_no_unused_backend(tmp_path):
    config = tmp_path / "tiny.toml"
    save_toml(to_dict(from_dict({"model": {"path": "builtin:tiny-sd1"},
                                 "dataset": {"path": str(ROOT / "assets" / "demo_dataset"), "resolution": 64},
                                 "schedule": {"max_steps": 1}, "samples": {"every_n_steps": 0},
                                 "output": {"dir": str(tmp_path), "name": "quiet"}})), config)
    done = subprocess.run([sys.executable, "-m", "trainer_backend", "train", "--config", str(config)],
                          env=ENV, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    log = (tmp_path / "quiet" / "train.log").read_text(encoding="utf-8")
    for line in NOISE:
        assert line not in done.stderr, f"console: {line!r}\n{done.stderr[-3000:]}"
        assert line not in _shown(log), f"train.log: {line!r}"
    # torchao and bitsandbytes were never imported: not even their DEBUG lines are there
    assert "torchao" not in log and "kernels-community" not in log, log
    assert "saved" in log and "WARNING" not in log


def test_a_run_that_asks_for_a_backend_loads_it_and_only_it(tmp_path):
    nf4 = from_dict({"model": {"path": "builtin:tiny-sd1", "quantize": "nf4"}})
    assert needed_backends(nf4) == {"bitsandbytes"}
    assert needed_backends(from_dict({"model": {"quantize_text_encoders": "int8"}})) == {"torchao"}
    assert needed_backends(from_dict({"optimizer": {"name": "adamw8bit"}})) == {"bitsandbytes"}
    assert needed_backends(from_dict({})) == set()
    config = tmp_path / "nf4.toml"
    save_toml(to_dict(nf4), config)
    probe = (
        "import sys\n"
        "from trainer_backend.config import load_config\n"
        "from trainer_backend.training.optional_backends import hold_back_unused\n"
        f"print(hold_back_unused(load_config({str(config)!r})))\n"
        "import bitsandbytes, importlib.util\n"
        "print(type(sys.modules.get('bitsandbytes')).__name__, importlib.util.find_spec('torchao'))\n")
    done = subprocess.run([sys.executable, "-c", probe], env=ENV, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split("\n")[:2] == ["['torchao']", "module None"], done.stdout


def test_harmless_lines_go_to_debug_and_real_warnings_still_show(tmp_path, capsys):
    """With the real library loggers: transformers' torchvision fallback is kept out of the console
    and written at DEBUG; a real transformers warning, an error that mentions the same words, and a
    Python warning show on the console and in train.log as they are."""
    from transformers.utils import logging as hf_logging
    from trainer_backend.run.events import setup_logging
    from trainer_backend.run.library_noise import route_library_loggers
    root = logging.getLogger()
    saved = list(root.handlers), root.level
    try:
        setup_logging(tmp_path, True)
        route_library_loggers()
        hf = hf_logging.get_logger("transformers.models.clip")
        hf.warning("`CLIPImageProcessor` requires torchvision (not installed); falling back to "
                   "`CLIPImageProcessorPil` for backward compatibility.")
        hf.warning("the checkpoint's vocabulary does not match the tokenizer")
        hf.error("`CLIPImageProcessor` requires torchvision (not installed); falling back to `CLIPImageProcessorPil`")
        warnings.warn("a real deprecation in user code", UserWarning)
        for handler in root.handlers:
            handler.flush()
        console = capsys.readouterr().err
        log = (tmp_path / "train.log").read_text(encoding="utf-8").splitlines()
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
            handler.close()
        for handler in saved[0]:
            root.addHandler(handler)
        root.setLevel(saved[1])
        logging.captureWarnings(False)
        hf_logging.disable_propagation()
        hf_logging.enable_default_handler()
    assert "backward compatibility" not in console
    assert any(" DEBUG `CLIPImageProcessor` requires torchvision" in line for line in log), log
    assert "WARNING the checkpoint's vocabulary does not match" in console
    assert any("WARNING the checkpoint's vocabulary does not match" in line for line in log)
    assert any(" ERROR `CLIPImageProcessor` requires torchvision" in line for line in log)
    assert "ERROR `CLIPImageProcessor`" in console
    assert "UserWarning: a real deprecation in user code" in console
    assert _shown("\n".join(log)).count("requires torchvision") == 1   # only the ERROR one on the Run page
