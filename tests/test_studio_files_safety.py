"""What the studio writes and accepts from outside (issue 37 items 9 and 10): a link placed in the
runs folder cannot carry a run outside the allowed folders; an upload from another web site is
refused, and an upload from the studio's own page is size-capped."""
from __future__ import annotations

import os

import pytest

from conftest import make_dataset
from trainer_backend.config import ConfigError, load_config


def test_a_link_in_the_runs_folder_cannot_lead_a_run_outside(tmp_path):
    from gui.run_control import RunManager
    runs, elsewhere = tmp_path / "runs", tmp_path / "elsewhere"
    runs.mkdir()
    elsewhere.mkdir()
    os.symlink(elsewhere, runs / "linkout")
    os.symlink(runs / "loop", runs / "loop")
    data = make_dataset(tmp_path / "data", n=1, size=32)
    manager = RunManager(runs, cwd=tmp_path)
    for name, leads in (("linkout", str(elsewhere)), ("loop", "a link loop")):
        cfg = load_config(None, ["model.path='builtin:tiny-sd1'", f"dataset.path='{data}'", f"output.dir='{runs}'",
                                 f"output.name='{name}'"])
        with pytest.raises(ConfigError) as e:
            manager.start(cfg)
        assert str(e.value).startswith(f"output.name: {runs / name} leads to {leads} through a link, outside")
    assert list(elsewhere.iterdir()) == []  # nothing was written there
    # a link that stays inside the runs folder is a folder like any other
    (runs / "real").mkdir()
    os.symlink(runs / "real", runs / "alias")
    manager._check_allowed(runs / "alias")
