"""Clips in the dataset workbench: generated clips (tests/video_clips.py) beside images in a dataset
folder are indexed with their durations and first-frame thumbnails, the grid's data names them with
their duration, the summary is the `clips` scan's own, a caption edit on a clip is written and undone,
and an unreadable clip is flagged with the scan's reason."""
from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from gui.datasets_clips import clip_detail
from gui.datasets_grid import grid_cells
from gui.datasets_model import Views
from gui.datasets_page import summary_markdown
from tests.video_clips import clip_with_audio, make_clip_dataset, moving_square
from tests.workbench_images import write_dataset
from trainer_backend.data.buckets import bucket_spec
from trainer_backend.data.video import probe_clip, write_clip
from trainer_backend.data.video_scan import VideoOptions, scan_clips, summary_lines
from trainer_backend.workbench import (CheckSettings, Operation, apply_plan, build_index, plan_edit, read_index,
                                       save_caption, thumb_path, undo)
from trainer_backend.workbench.index import list_media
from trainer_backend.workbench.library import exclude, excluded, list_datasets, restore
from trainer_backend.workbench.clips import family_of, options_of, windows_of, windows_summary


def _dataset(folder: Path) -> Path:
    """Three 9-frame mp4 clips, a 25-frame one, a 5-frame image sequence, two images, a broken .mov."""
    make_clip_dataset(folder, n=3, size=32, frames=9)
    write_clip(folder / "long.mp4", moving_square(25, 48, seed=7), fps=16)
    (folder / "long.txt").write_text("a long clip")
    seq = folder / "spin.frames"
    seq.mkdir()
    for i, frame in enumerate(moving_square(5, 32, seed=9)):
        Image.fromarray(frame).save(seq / f"{i:04d}.png")
    (folder / "spin.txt").write_text("it spins")
    write_dataset(folder, 2, size=(32, 32))
    (folder / "broken.mov").write_bytes(b"\x00" * 300)
    return folder


def test_index_has_clip_durations_thumbnails_and_the_scans_reason(tmp_path):
    folder, cache = _dataset(tmp_path / "clips"), tmp_path / "cache"
    records = {r["path"]: r for r in build_index(folder, cache, workers=1)}
    assert sorted(records) == ["broken.mov", "clip000.mp4", "clip001.mp4", "clip002.mp4", "img_00000.png",
                               "img_00001.png", "long.mp4", "spin.frames"]
    walk = records["clip000.mp4"]
    assert walk["clip"] == {"kind": "video", "frames": 9, "fps": 16.0, "duration_s": 0.562, "audio": False}
    assert (walk["width"], walk["height"]) == (32, 32)
    thumb = Image.open(thumb_path(cache, walk["sha256"]))
    # the thumbnail is the clip's first frame: the square's colour over the background, as generated
    first = moving_square(9, 32, seed=0)[0].astype(int)
    assert np.abs(np.asarray(thumb.convert("RGB").resize((32, 32))).astype(int) - first).mean() < 12
    assert records["spin.frames"]["clip"]["kind"] == "frames" and records["spin.frames"]["clip"]["frames"] == 5
    assert thumb_path(cache, records["spin.frames"]["sha256"]).is_file()
    assert "clip" not in records["img_00000.png"]
    # the unreadable clip carries the reason the `clips` scan gives for skipping it
    scan = scan_clips(folder, VideoOptions(), bucket_spec(32, True, step=16))
    (skipped,) = scan.summary["skipped"]
    assert Path(skipped["file"]).name == "broken.mov"
    assert records["broken.mov"]["flags"] == {"unreadable": skipped["reason"]}
    # indexed again with nothing changed: the records are reused (a frames folder included)
    assert {r["path"]: r for r in build_index(folder, cache, workers=1)} == records
    # a frame added to the sequence makes it stale
    Image.fromarray(moving_square(1, 32, seed=3)[0]).save(folder / "spin.frames" / "0005.png")
    again = {r["path"]: r for r in build_index(folder, cache, workers=1)}
    assert again["spin.frames"]["clip"]["frames"] == 6


def test_summary_windows_and_grid_labels_follow_the_training_settings(tmp_path):
    folder, cache = _dataset(tmp_path / "clips"), tmp_path / "cache"
    files_before = sorted(p.name for p in folder.iterdir())
    build_index(folder, cache, workers=1)
    values = {"model.arch": "wan22_t2v", "dataset.video_frames": 9, "dataset.video_fps": 16,
              "dataset.video_clip_mode": "uniform", "dataset.resolution": 32, "dataset.bucketing": True,
              "dataset.bucket_step": 16}
    arch, step = family_of(values)
    assert (arch, step) == ("wan22_t2v", 4)
    opts = options_of(values, step)
    spec = bucket_spec(32, True, step=16)
    records = list(read_index(cache, folder).values())
    # the workbench's summary from the index is the `clips` scan's summary of the folder
    assert windows_summary(folder, records, opts, spec) == scan_clips(folder, opts, spec).summary
    long = read_index(cache, folder)["long.mp4"]
    assert [w.start for w in windows_of(folder, long, opts, spec)] == [0, 8, 16]   # 25 frames: 3 windows of 9

    views = Views(cache)
    view = views.get(folder, CheckSettings(resolution=32, bucketing=True, bucket_step=16), video=values)
    labels = [label for _, label in grid_cells(cache, view.items, list(range(len(view.items))))]
    assert "clip000.mp4 ▶ 0.6 s, 9 f" in labels and "long.mp4 ▶ 1.6 s, 25 f" in labels
    assert "spin.frames ▶ 5 f at 16 fps" in labels
    assert any(label.startswith("broken.mov ⚠ unreadable") for label in labels)
    assert "img_00000.png" in labels
    assert [view.items[i]["path"] for i in view.filtered("images")] == ["img_00000.png", "img_00001.png"]
    assert len(view.filtered("clips")) == 6
    text = summary_markdown(view, running=False)
    assert "**2 images, 6 clips**" in text
    for line in summary_lines(scan_clips(folder, opts, spec).summary)[:2]:
        assert line in text
    assert "bucket 9x32x32" in text and "unreadable 1" in text

    # a clip clicked: a strip row per window, and the first window (9 frames) as a preview in the cache
    strip, preview, info = clip_detail(cache, view, next(i for i in view.items if i["path"] == "long.mp4"))
    assert strip.height == 3 * 96 + 2 * 4 and "3 windows of 9 frames" in info and "frame bucket **9x32x32**" in info
    assert Path(preview).parent == cache / "previews" and probe_clip(Path(preview)).frames == 9
    assert sorted(p.name for p in folder.iterdir()) == files_before   # nothing is written in the dataset
    strip, preview, info = clip_detail(cache, view, next(i for i in view.items if i["path"] == "broken.mov"))
    assert (strip, preview) == (None, None) and "**unreadable**: cannot read the video" in info

    # a value the schema refuses: the line names the field, and no windows are made up
    bad = views.get(folder, CheckSettings(resolution=32), video={**values, "dataset.video_frames": 0})
    assert "windows wait for a valid setting: dataset.video_frames: Input should be greater than or equal to 1" \
        in summary_markdown(bad, running=False)

    # an image family: the clips are counted, and the line says they are not trained
    image_view = views.get(folder, CheckSettings(resolution=32), video={"model.arch": "flux"})
    text = summary_markdown(image_view, running=False)
    assert "6 clips" in text and "Flux.1 (dev, schnell) trains images only" in text
    assert "windows" not in text


def test_a_clips_caption_is_edited_and_undone_like_an_images(tmp_path):
    folder = make_clip_dataset(tmp_path / "clips", n=1)
    caption = folder / "clip000.txt"
    before = caption.read_text()
    entry = save_caption(folder, "clip000.mp4", "a red square, edited", before, ".txt")
    assert entry and caption.read_text() == "a red square, edited"
    undo(folder)
    assert caption.read_text() == before
    # a bulk edit over the page's items (clips among them), undone as one entry
    changes = plan_edit(folder, ["clip000.mp4"], Operation("prepend", "ohwx"))
    apply_plan(folder, changes, "prepend 'ohwx'")
    assert caption.read_text() == f"ohwx, {before}"
    undo(folder)
    assert caption.read_text() == before
    assert (folder / "clip000.mp4").stat().st_size > 0   # the clip itself is never touched


def test_a_clip_or_sequence_is_excluded_and_restored_with_its_caption(tmp_path):
    folder = _dataset(tmp_path / "clips")
    (info,) = list_datasets(tmp_path)
    assert (info.images, info.clips, info.captioned) == (2, 6, 7)
    exclude(folder, "clip001.mp4")
    exclude(folder, "spin.frames")
    assert excluded(folder) == ["clip001.mp4", "spin.frames"]     # the sequence's frames are not listed as images
    assert not (folder / "clip001.txt").exists() and not (folder / "spin.frames").exists()
    assert [p.name for p in list_media(folder)].count("spin.frames") == 0
    restore(folder, "spin.frames")
    restore(folder, "clip001.mp4")
    assert (folder / "spin.txt").read_text() == "it spins" and len(list((folder / "spin.frames").iterdir())) == 5
    assert (folder / "clip001.txt").is_file() and excluded(folder) == []


def test_the_training_pages_inspector_shows_the_clip_lines_for_a_video_family(tmp_path):
    from gui import dataset_view as dv
    from trainer_backend.config import from_dict
    folder = _dataset(tmp_path / "clips")
    wan = tmp_path / "Wan2.2-T2V"   # a Wan 2.2 folder (arch auto): the family the inspector plans for
    wan.mkdir()
    (wan / "model_index.json").write_text('{"_class_name": "WanPipeline"}')
    dataset = {"path": str(folder), "resolution": 32, "video_frames": 9, "video_clip_mode": "uniform"}
    inspection = dv.inspect_dataset(from_dict({"model": {"path": str(wan)}, "dataset": dataset}),
                                    cwd=Path(__file__).resolve().parent.parent)
    video = inspection.summary["video"]
    assert (video["clips"], video["windows"], video["images_as_frames"]) == (5, 7, 2)  # long.mp4: 3 windows
    text = dv.summary_markdown(inspection.summary)
    assert "**5 clips (7 windows) and 2 images**" in text
    assert "clips: 5 (and 2 images as 1-frame clips), 3.56 s in all, mean 0.71 s a clip, 0 with an audio track" in text
    assert "windows: 7 (uniform, 4k+1 frames at 16 fps)" in text and "9x32x32: 6" in text
    assert "`broken.mov`: cannot read the video" in text          # the scan's skipped line, as before
    labels = [label for _, label in dv.thumbnails(inspection.summary)]
    assert labels == ["img_00000.png", "img_00001.png", "clip000.mp4 ▶ 0.6 s, 9 f", "clip001.mp4 ▶ 0.6 s, 9 f",
                      "clip002.mp4 ▶ 0.6 s, 9 f", "long.mp4 ▶ 1.6 s, 25 f", "spin.frames ▶ 5 f at 16 fps"]
    # an image family: the scan leaves the clips out, and the inspector says so
    images_only = dv.summary_markdown({**inspection.summary, "video": None})
    assert "6 clips in the dataset are not trained: the model's family trains images only" in images_only


def test_clips_are_uploaded_zipped_imported_and_a_studio_dataset_with_clips_deleted(tmp_path):
    import zipfile

    import pytest

    from trainer_backend.workbench.library import LibraryError, add_files, add_zip, create_dataset, \
        delete_dataset, import_folder
    source = _dataset(tmp_path / "source")
    ds = create_dataset(tmp_path / "datasets", "walks")
    added = add_files(ds, [("walk.mp4", source / "clip000.mp4"), ("walk.txt", source / "clip000.txt")])
    assert [p.name for p in added] == ["walk.mp4"] and (ds / "walk.txt").read_text() == (source / "clip000.txt").read_text()
    # a clip that cannot be read refuses the whole upload with the scan's reason; nothing is added
    with pytest.raises(LibraryError, match=r"^broken\.mov: cannot read the video .*; nothing was added$"):
        add_files(ds, [("run.mp4", source / "clip001.mp4"), ("broken.mov", source / "broken.mov")])
    assert not (ds / "run.mp4").exists()
    archive = tmp_path / "clips.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.write(source / "long.mp4", "3_walk/long.mp4")
        z.write(source / "long.txt", "3_walk/long.txt")
    assert [p.relative_to(ds).as_posix() for p in add_zip(ds, archive)] == ["3_walk/long.mp4"]
    assert (ds / "3_walk" / "long.txt").read_text() == "a long clip"
    other = create_dataset(tmp_path / "datasets", "copied")
    names = sorted(p.name for p in import_folder(source, other))
    assert names == ["broken.mov", "clip000.mp4", "clip001.mp4", "clip002.mp4", "img_00000.png", "img_00001.png",
                     "long.mp4", "spin.frames"]
    assert len(list((other / "spin.frames").iterdir())) == 5 and (other / "spin.txt").read_text() == "it spins"
    delete_dataset(other)   # images, clips (a sequence folder too) and captions: all the studio brought in
    assert not other.exists() and (source / "spin.frames").is_dir()


def test_a_clip_with_an_audio_track_is_marked_and_counted(tmp_path):
    folder, cache = make_clip_dataset(tmp_path / "clips", n=1), tmp_path / "cache"
    clip_with_audio(folder / "talk.mp4")
    (folder / "talk.txt").write_text("a square that hums")
    build_index(folder, cache, workers=1)
    values = {"model.arch": "ltx2", "dataset.video_frames": 9}
    view = Views(cache).get(folder, CheckSettings(resolution=32), video=values)
    labels = [label for _, label in grid_cells(cache, view.items, list(range(len(view.items))))]
    assert labels == ["clip000.mp4 ▶ 0.6 s, 9 f", "talk.mp4 ▶ 0.6 s, 9 f ♪"]
    assert "clips: 2 (2 videos, 0 image sequences, 0 images), 1.12 s in all, 1 with an audio track" \
        in summary_markdown(view, running=False)
    assert "9x32x32: 2" in summary_markdown(view, running=False).replace("bucket ", "")
