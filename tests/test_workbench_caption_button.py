"""The Datasets page's caption button (gui/datasets_caption.py) starts the captioners' job
(trainer_backend.captioners, built by issue 30B) on the open dataset; its captions are journaled,
so the page's Undo reverts them."""
from pathlib import Path

import pytest

from gui.datasets_caption import caption_options, progress_markdown, start
from gui.shared_state import Settings, Studio
from tests.workbench_images import write_dataset
from trainer_backend.workbench import undo
from trainer_backend.workbench.library import LibraryError


def test_the_button_builds_the_jobs_options(tmp_path):
    options = caption_options(tmp_path / "dogs", tmp_path / "runs", " builtin:tiny-caption-florence2 ", "ohwx",
                              "skip", "natural", "short", ".caption")
    assert options.dataset == str(tmp_path / "dogs") and options.model == "builtin:tiny-caption-florence2"
    assert options.job_dir == str(tmp_path / "runs" / "caption-dogs")
    assert (options.trigger, options.existing, options.caption_extension) == ("ohwx", "skip", ".caption")
    with pytest.raises(LibraryError, match="captioner: give a model"):
        caption_options(tmp_path, tmp_path, "", "", "skip", "auto", "short")
    assert progress_markdown(tmp_path / "no-job") .startswith("Captioning: waiting to start")


@pytest.mark.slow
def test_the_button_captions_the_dataset_and_undo_reverts(tmp_path):
    import time
    folder = tmp_path / "datasets" / "dogs"
    write_dataset(folder, 2, caption=False)
    studio = Studio.create(Settings(runs_dir=tmp_path / "runs", datasets_dir=tmp_path / "datasets"))
    options = caption_options(folder, tmp_path / "runs", "builtin:tiny-caption-florence2", "ohwx", "skip", "auto",
                              "short")
    job = start(studio, options)
    deadline = time.time() + 240
    while "done" not in progress_markdown(job) and time.time() < deadline:
        assert "error" not in progress_markdown(job), progress_markdown(job)
        time.sleep(1)
    assert "2/2 images" in progress_markdown(job)
    assert all(Path(p).read_text().startswith("ohwx") for p in folder.glob("*.txt")) and len(list(folder.glob("*.txt"))) == 2
    while True:
        try:
            undo(folder)
        except ValueError:
            break
    assert not list(folder.glob("*.txt"))
