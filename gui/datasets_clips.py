"""Clips in the studio, without Gradio. The Datasets page: the summary's clip lines (the `clips` scan's
own lines, data/video_scan.summary_lines, for the Training form's video family; a count and a note for an
image family) and a clip's detail: the frame strip of the windows the trainer takes, a short mp4
preview of the first window (written in the cache, never in the dataset) and the info text with its
windows and frame bucket. The Training page's dataset inspector: the clip lines of the trainer's scan
(data/video_items.clip_summary), clips' first frames, and the clips an image family leaves out. The
arithmetic is trainer_backend.workbench.clips' (the scan's functions)."""
from __future__ import annotations

from pathlib import Path

from trainer_backend.data.buckets import bucket_name
from PIL import Image

from trainer_backend.data.video import BadClip, decode_frames, probe_clip
from trainer_backend.data.video_scan import VideoOptions, summary_lines
from trainer_backend.families.registry import VIDEO_FAMILIES
from trainer_backend.workbench.clips import clip_info, clip_label, list_clips, preview_clip, windows_of, \
    windows_strip

from gui.datasets_model import FLAG_LABELS

# the [dataset] keys a clip's windows depend on (read from the Training form with the bucket settings)
VIDEO_KEYS = ("video_frames", "video_fps", "video_clip_mode", "video_max_windows", "video_frame_buckets",
              "video_sequence_fps")
PREVIEW_MAX_FRAMES = 161     # an image family's preview: the clip's start at its own rate


def clip_lines(view) -> list[str]:
    """The summary's clip lines (markdown): for a video family the `clips` scan's lines of the indexed
    clips; for another family the counts and that it trains images only."""
    clips = [i for i in view.items if "clip" in i]
    if not view.clip_count():
        return []
    arch, label, step = view.family
    if view.video_problem:
        return [f"{len(clips)} clips read: **{label}**'s windows wait for a valid setting: {view.video_problem}"]
    if step and view.clip_summary is not None:
        s = view.clip_summary
        lines = [line.strip() for line in summary_lines(s)]
        lines[0] += f", mean {s['mean_duration_s']:g} s a clip" if s["videos"] + s["image_sequences"] else ""
        return [f"**{label}:** {lines[0]}", *lines[1:]]
    videos = sum(1 for i in clips if i["clip"]["kind"] == "video")
    seconds = sum(i["clip"]["duration_s"] for i in clips)
    counted = (f"{len(clips)} clips read ({videos} videos, {len(clips) - videos} image sequences), "
               f"{seconds:.1f} s in all")
    if label:
        return [f"{counted}: **{label} trains images only**; the clips are not trained (a video family does: "
                f"model.arch = {', '.join(VIDEO_FAMILIES)})."]
    return [f"{counted}: the Training form's model names no family yet (model.arch = {arch}); set model.arch "
            f"to a video family ({', '.join(VIDEO_FAMILIES)}) to see the windows and frame buckets."]


def clip_detail(cache: Path, view, item: dict):
    """(frame strip PIL image or None, preview mp4 path or None, markdown) of one clip item."""
    lines = [f"**{item['path']}**"]
    c = item.get("clip")
    info = clip_info(item, view.video_options.sequence_fps if view.video_options else 0.0)   # a sequence: the form's fps
    if c is None or info is None:   # not indexed yet, or unreadable (its reason below)
        lines.append("not indexed yet" if item.get("pending") else "")
        lines += [f"- ⚠ **{FLAG_LABELS.get(kind, kind)}**: {message}" for kind, message in item["flags"].items()]
        return None, None, "\n".join(lines)
    kind = {"video": "video", "frames": "image sequence"}[c["kind"]]
    lines.append(f"{kind} · {item['width']}×{item['height']} px · {info.frames} frames at {info.fps:g} fps · "
                 f"{info.duration:.2f} s · {'an audio track' if info.has_audio else 'no audio track'}")
    arch, label, step = view.family
    spec = view.settings.spec_and_buckets()[0]
    if view.video_problem:
        lines.append(f"**{label}**'s windows wait for a valid setting: {view.video_problem}")
        return None, None, "  \n".join(lines)
    if step:
        opts = view.video_options
        windows = windows_of(view.folder, item, opts, spec)
        if windows:
            first = windows[0]
            starts = ", ".join(str(w.start) for w in windows[:12]) + (" …" if len(windows) > 12 else "")
            lines.append(f"**{label}**: {len(windows)} window{'s' if len(windows) > 1 else ''} of {first.frames} "
                         f"frames ({opts.clip_mode}, {opts.frame_step}k+1 at {opts.fps:g} fps), frame bucket "
                         f"**{first.frame_bucket}**; starts at target frame {starts}"
                         + (" (a new start each epoch)" if first.random_start else ""))
        else:
            lines.append(f"**{label}**: no window: the clip is too short for the settings (the trainer skips it)")
    else:
        opts = VideoOptions(frame_step=1, fps=0, max_frames=PREVIEW_MAX_FRAMES)
        windows = windows_of(view.folder, item, opts, spec)
        bucket = bucket_name(windows[0].bucket) if windows else "?"
        lines.append(f"{label or 'The model'} trains images only: the strip shows the clip (bucket {bucket} if it "
                     f"were trained).")
    lines += [f"- ⚠ **{FLAG_LABELS.get(kind, kind)}**: {message}" for kind, message in item["flags"].items()]
    strip = preview = None
    if windows:
        path = view.folder / item["path"]
        try:
            strip = windows_strip(path, windows, opts.fps)
            key = "|".join(map(str, (item.get("sha256"), opts.fps, windows[0].start, windows[0].frames)))
            preview = preview_clip(path, windows[0], opts.fps, cache, key)
            if len(windows) > 1:
                lines.append(f"The strip shows {min(len(windows), 4)} of the windows (a row each); the player, "
                             f"the first window as the trainer samples it.")
        except (BadClip, OSError) as e:
            lines.append(f"cannot be shown: {e}")
    return strip, (str(preview) if preview else None), "  \n".join(lines)


# ---- the Training page's dataset inspector ---------------------------------------------------------------

def inspector_clip_lines(video: dict) -> list[str]:
    """A video family's clips as the scan counted them (data/video_items.clip_summary): clips, seconds, audio
    tracks, windows and frame buckets (the lines the Datasets page and the `clips` CLI show)."""
    clips = video.get("clips", 0)
    audio = video.get("with_audio", 0)
    trained = f" ({video['audio_trained']} trained)" if video.get("audio_trained") else ""
    images = video.get("images_as_frames", 0)
    lines = [f"clips: {clips}" + (f" (and {images} images as 1-frame clips)" if images else "")
             + f", {video.get('duration_s', 0):g} s in all, mean {video.get('duration_s', 0) / max(1, clips):.2f} s "
             f"a clip, {audio} with an audio track{trained}",
             f"windows: {video.get('windows', 0)} ({video.get('clip_mode')}, {video.get('frame_rule')} frames at "
             f"{video.get('fps', 0):g} fps)"]
    buckets = video.get("frame_buckets") or {}
    if buckets:
        lines.append("frame buckets: " + " · ".join(f"{name}: {n}" for name, n in buckets.items()))
    return lines


def untrained_clips(summary: dict) -> int:
    """The clips (video files, `<name>.frames` folders) in the scanned folders, for an image family's scan."""
    return len({clip for s in summary.get("subsets", [])
                if s.get("source", "folders") == "folders" and not s.get("is_class") and Path(s.get("path") or "").is_dir()
                for clip in list_clips(Path(s["path"]))})


def clip_thumbnails(summary: dict, limit: int, size: int) -> list:
    """(PIL first frame, 'walk.mp4 ▶ 2.4 s, 38 f') of the first clips of the scanned folders; a clip that
    cannot be read is left out (the summary lists it as skipped)."""
    out = []
    folders = [Path(s["path"]) for s in summary.get("subsets", []) if not s.get("is_class")
               and Path(s.get("path") or "").is_dir()]
    for clip in dict.fromkeys(c for folder in folders for c in list_clips(folder)):
        if len(out) >= limit:
            break
        try:
            info = probe_clip(clip)
            image = Image.fromarray(decode_frames(clip, [0])[0])
        except (BadClip, OSError):
            continue
        image.thumbnail((size, size))
        record = {"clip": {"kind": info.kind, "frames": info.frames, "fps": info.fps, "duration_s": info.duration}}
        out.append((image, clip_label(clip.name, record)))
    return out
