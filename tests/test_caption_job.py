"""The caption job end to end on the CPU with a tiny random captioner of every kind (Florence-2,
Qwen2.5-VL, Qwen3-VL, JoyCaption's LLaVA, the WD14-style ONNX tagger, and a Qwen2-VL through the generic
AutoModelForImageTextToText path): caption files written
through the dataset's undo journal, a hand-written caption kept, a corrupt image skipped with one
line, Stop and a second start that continues, the preview that writes nothing. The captions are
gibberish (random weights); everything around them is real."""
import json
import time
from pathlib import Path

import pytest
from PIL import Image

from trainer_backend.__main__ import main
from trainer_backend.captioners import (KIND_NAMES, CaptionOptions, caption_progress, run_caption_job,
                                        start_caption_job, stop_caption_job)
from trainer_backend.captioners.worklist import LEDGER
from trainer_backend.run.contract import EVENTS_FILE, LOG_FILE
from trainer_backend.workbench import entries, undo

HAND_WRITTEN = "my own words about this picture"


def make_images(folder: Path, n: int = 3) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        Image.new("RGB", (32 + 8 * i, 40), (60 * i, 200 - 50 * i, 90)).save(folder / f"img{i}.png")
    (folder / "img1.txt").write_text(HAND_WRITTEN)
    (folder / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n truncated")
    return folder


def events(job_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (job_dir / EVENTS_FILE).read_text().splitlines()]


@pytest.mark.parametrize("kind", KIND_NAMES)
def test_a_tiny_captioner_of_each_kind_captions_the_uncaptioned_images(tmp_path, kind):
    data = make_images(tmp_path / "data")
    job = tmp_path / "job"
    code = run_caption_job(CaptionOptions(dataset=str(data), model=f"builtin:tiny-caption-{kind}", job_dir=str(job),
                                          trigger="ohwx", batch_size=2, max_new_tokens=6))
    assert code == 0
    for name in ("img0", "img2"):
        text = (data / f"{name}.txt").read_text()
        assert text.startswith("ohwx") and "\n" not in text
    assert (data / "img1.txt").read_text() == HAND_WRITTEN          # existing captions are kept by default
    assert not (data / "broken.txt").exists()
    skipped = [line for line in (job / LOG_FILE).read_text().splitlines() if "broken.png" in line]
    assert len(skipped) == 1 and "skipped" in skipped[0]
    kinds = [e["event"] for e in events(job)]
    assert kinds[0] == "start" and kinds[-1] == "done" and events(job)[-1]["step"] == 3
    assert not list(data.glob("*.tmp")) and not list(data.glob(".*.tmp"))   # written atomically: no leftovers
    # every write is one undoable journal entry per batch: undoing them all removes the new captions
    for _ in entries(data):
        undo(data)
    assert not (data / "img0.txt").exists() and (data / "img1.txt").read_text() == HAND_WRITTEN


def test_overwrite_and_append_keep_the_previous_text_in_the_undo_journal(tmp_path):
    data = make_images(tmp_path / "data")
    options = dict(dataset=str(data), model="builtin:tiny-caption-wd14", job_dir=str(tmp_path / "job"))
    assert run_caption_job(CaptionOptions(**options, existing="append")) == 0
    appended = (data / "img1.txt").read_text()
    assert appended.startswith(HAND_WRITTEN + ", ") and len(appended) > len(HAND_WRITTEN) + 2
    assert run_caption_job(CaptionOptions(**options, existing="overwrite", fresh=True)) == 0
    assert not (data / "img1.txt").read_text().startswith(HAND_WRITTEN)
    while any(not e.undone for e in entries(data)):
        undo(data)
    assert (data / "img1.txt").read_text() == HAND_WRITTEN


def test_preview_captions_four_images_and_writes_nothing(tmp_path, capsys):
    data = make_images(tmp_path / "data", n=6)
    code = main(["caption", "--dataset", str(data), "--model", "builtin:tiny-caption-wd14", "--preview",
                 "--job-dir", str(tmp_path / "job"), "--trigger", "ohwx"])
    assert code == 0
    shown = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert len(shown) == 3 and all(s["caption"].startswith("ohwx") for s in shown)   # 4 asked, one corrupt
    assert sorted(p.name for p in data.glob("*.txt")) == ["img1.txt"]
    assert json.loads((tmp_path / "job" / "preview.json").read_text()) == shown


def test_a_captioner_that_cannot_write_the_target_is_one_line_naming_the_flag(tmp_path, capsys):
    data = make_images(tmp_path / "data")
    code = main(["caption", "--dataset", str(data), "--model", "builtin:tiny-caption-wd14", "--target", "natural",
                 "--job-dir", str(tmp_path / "job")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1].startswith("error: --target natural:")
    code = main(["caption", "--dataset", str(tmp_path / "missing"), "--model", "builtin:tiny-caption-wd14"])
    assert code == 2 and "--dataset" in capsys.readouterr().err
    code = main(["caption", "--dataset", str(data), "--model", "builtin:tiny-caption-florence2", "--device", "cpu",
                 "--quantize", "4bit", "--job-dir", str(tmp_path / "job")])
    assert code == 2 and capsys.readouterr().err.strip().splitlines()[-1].startswith("error: --quantize 4bit:")
    assert not (data / "img0.txt").exists()


def test_stop_then_a_second_start_continues_where_the_first_stopped(tmp_path):
    """Real processes: the job started as the studio starts it, Stop after its first batch (control
    file + SIGTERM), exit 75, then a second start captions only the rest."""
    data = tmp_path / "data"
    data.mkdir()
    for i in range(10):
        Image.new("RGB", (32, 32), (20 * i, 90, 200 - 15 * i)).save(data / f"img{i}.png")
    options = CaptionOptions(dataset=str(data), model="builtin:tiny-caption-florence2", job_dir=str(tmp_path / "job"),
                             batch_size=1, max_new_tokens=48)
    job = start_caption_job(options)
    deadline = time.monotonic() + 240
    while caption_progress(job).done < 1:
        assert time.monotonic() < deadline and caption_progress(job).state in ("running", "not started"), \
            (job / "console.log").read_text()[-2000:]
        time.sleep(0.05)
    assert stop_caption_job(job)
    while caption_progress(job).state == "running":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    first = caption_progress(job)
    assert first.state == "stopped" and 1 <= first.done < 10 and first.total == 10
    written = sorted(p.name for p in data.glob("*.txt"))
    assert len(written) == first.done

    job = start_caption_job(options)
    while caption_progress(job).state in ("running", "not started"):
        assert time.monotonic() < deadline, (job / "console.log").read_text()[-2000:]
        time.sleep(0.1)
    second = caption_progress(job)
    assert second.state == "done" and second.done == 10 and second.total == 10
    assert len(list(data.glob("*.txt"))) == 10
    ledger = [json.loads(line)["image"] for line in (job / LEDGER).read_text().splitlines()]
    assert sorted(ledger) == sorted(f"img{i}.png" for i in range(10))   # each image captioned once
    starts = [e for e in events(job) if e["event"] == "start"]
    assert starts[-1]["step"] == first.done                             # the second start began where the first stopped
    assert "torchao" not in (job / "console.log").read_text()          # no library noise: no captioner uses it


def test_a_caption_edited_while_the_job_ran_is_left_as_it_is(tmp_path, monkeypatch):
    from trainer_backend.captioners import job as job_module
    data = make_images(tmp_path / "data")
    generate = job_module.Captioner.__call__

    def someone_edits_meanwhile(self, images):
        (data / "img0.txt").write_text("typed in another window")
        return generate(self, images)

    monkeypatch.setattr(job_module.Captioner, "__call__", someone_edits_meanwhile)
    job = tmp_path / "job"
    assert run_caption_job(CaptionOptions(dataset=str(data), model="builtin:tiny-caption-wd14", job_dir=str(job))) == 0
    assert (data / "img0.txt").read_text() == "typed in another window"
    assert (data / "img2.txt").exists()
    assert any("kept img0.txt" in line for line in (job / LOG_FILE).read_text().splitlines())


def test_make_tiny_model_offers_the_captioners(tmp_path, capsys):
    from trainer_backend.captioners import detect_kind
    assert main(["make-tiny-model", "--arch", "caption-wd14", "--out", str(tmp_path / "tagger")]) == 0
    assert detect_kind(tmp_path / "tagger").name == "wd14"


def test_a_second_job_on_the_same_folder_is_refused_while_the_first_runs(tmp_path):
    from trainer_backend.errors import ConfigError
    from trainer_backend.run.run_lock import acquire
    data = make_images(tmp_path / "data")
    job = tmp_path / "job"
    with acquire(job, by="caption job"):   # the first job holds the folder
        with pytest.raises(ConfigError, match=r"^--job-dir: the caption job in .* is already running"):
            run_caption_job(CaptionOptions(dataset=str(data), model="builtin:tiny-caption-wd14", job_dir=str(job)))
    assert not (data / "img0.txt").exists()
    user_folder = tmp_path / "documents"
    user_folder.mkdir()
    (user_folder / "letter.odt").write_text("mine")
    with pytest.raises(ConfigError, match=r"^--job-dir: .*documents already exists and is not a run folder"):
        run_caption_job(CaptionOptions(dataset=str(data), model="builtin:tiny-caption-wd14", job_dir=str(user_folder)))


def test_a_caption_job_runs_as_a_job_of_the_studio_queue(tmp_path):
    from trainer_backend.captioners import queue_caption_job
    from trainer_backend.jobqueue import JobQueue, QueueSettings
    data = make_images(tmp_path / "data")
    queue = JobQueue(QueueSettings(runs_dir=tmp_path / "runs", poll_s=0.1)).start()
    try:
        job = queue_caption_job(queue, CaptionOptions(dataset=str(data), model="builtin:tiny-caption-wd14",
                                                      job_dir=str(tmp_path / "runs" / "caption-data")))
        finished = queue.worker.wait(job.id, 240)
        assert finished.status == "done", (Path(job.run_dir) / "console.log").read_text()[-2000:]
    finally:
        queue.close()
    assert (data / "img0.txt").read_text() and (data / "img1.txt").read_text() == HAND_WRITTEN
    assert caption_progress(Path(job.run_dir)).state == "done"


def test_a_folder_that_is_no_captioner_is_one_line_naming_the_model(tmp_path):
    from trainer_backend.captioners import detect_kind
    from trainer_backend.errors import ConfigError
    (tmp_path / "bert").mkdir()
    (tmp_path / "bert" / "config.json").write_text('{"model_type": "bert"}')
    with pytest.raises(ConfigError, match=r"^--model: .*'bert' model, which transformers does not read"):
        detect_kind(tmp_path / "bert")
    with pytest.raises(ConfigError, match=r"^--model: .*no config.json"):
        detect_kind(tmp_path)


def test_large_images_reach_the_captioner_scaled_down(tmp_path, monkeypatch):
    from trainer_backend.captioners import job as job_module
    data = tmp_path / "data"
    data.mkdir()
    Image.new("RGB", (300, 120), (10, 120, 250)).save(data / "wide.png")
    Image.new("RGB", (48, 40), (250, 120, 10)).save(data / "small.png")
    seen = []
    generate = job_module.Captioner.__call__

    def recording(self, images):
        seen.extend(img.size for img in images)
        return generate(self, images)

    monkeypatch.setattr(job_module.Captioner, "__call__", recording)
    options = CaptionOptions(dataset=str(data), model="builtin:tiny-caption-wd14", job_dir=str(tmp_path / "job"),
                             image_side=100)
    assert run_caption_job(options) == 0
    assert sorted(seen) == [(48, 40), (100, 40)]


def test_the_studio_can_import_the_captioners_without_torch():
    import subprocess
    import sys
    code = ("import sys, trainer_backend.captioners; "
            "print(sorted(m for m in ('torch', 'transformers', 'onnxruntime') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
