"""`python -m trainer_backend clips FOLDER`: what a folder of clips gives for a video family: clip counts,
durations, windows and frame buckets, and the skipped files with their reasons (no torch)."""
from __future__ import annotations

import json
from pathlib import Path


def add_parser(sub) -> None:
    p = sub.add_parser("clips", help="summarise a folder of video clips: counts, durations, windows, frame buckets")
    p.add_argument("folder")
    p.add_argument("--frame-step", type=int, default=4,
                   help="the family's frame-count rule k*STEP+1 (Wan 2.2: 4, LTX-2: 8)")
    p.add_argument("--fps", type=float, default=16.0, help="target frame rate frames are sampled at (0: the clip's own)")
    p.add_argument("--max-frames", type=int, default=81, help="the longest window, rounded down to the rule")
    p.add_argument("--clip-mode", choices=("head", "uniform", "random"), default="head",
                   help="how a clip longer than a window is cut: its head, windows spread evenly, or a random one per epoch")
    p.add_argument("--resolution", type=int, default=480, help="bucket area = resolution squared")
    p.add_argument("--bucket-step", type=int, default=64, help="bucket sides are multiples of this")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")


def run(args) -> int:
    from ..errors import ConfigError
    from ..run import exitcodes
    from .buckets import bucket_spec
    from .video_scan import VideoOptions, scan_clips, summary_lines
    folder = Path(args.folder).expanduser()
    if not folder.is_dir():
        raise ConfigError(f"folder: {folder} is not a folder")
    try:
        opts = VideoOptions(frame_step=args.frame_step, fps=args.fps, max_frames=args.max_frames,
                            clip_mode=args.clip_mode)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    scan = scan_clips(folder, opts, bucket_spec(args.resolution, True, step=args.bucket_step))
    if args.json:
        print(json.dumps(scan.summary, indent=1))
    else:
        print("\n".join(summary_lines(scan.summary)))
        for s in scan.summary["skipped"]:
            print(f"  skipped {s['file']}: {s['reason']}")
    return exitcodes.OK if scan.windows else exitcodes.BAD_CONFIG
