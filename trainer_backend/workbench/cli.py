"""`python -m trainer_backend dataset check|edit|undo|index FOLDER`: the workbench from the command line.

    dataset check FOLDER [--json] [--resolution 512 --bucketing ...]   flags and duplicates
    dataset edit FOLDER --prepend TEXT | --append TEXT | --replace OLD NEW [--regex]
                        | --remove-tag TAG | --rename-tag OLD NEW  [--dry-run]
    dataset undo FOLDER [--entry ID] [--list]
    dataset index FOLDER --cache DIR      (the studio's background thumbnailer; prints progress)

Exit codes: 0 done, 2 bad input (one line on stderr naming the file or option; nothing changed).
The studio's Datasets page calls the same functions (checks.py, edits.py, journal.py).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .checks import CheckSettings, annotate, report
from .edits import EditError, Operation, apply_plan, plan_edit, preview
from .index import build_index
from .journal import JournalError, entries, undo


def add_parser(sub) -> None:
    ds = sub.add_parser("dataset", help="check a dataset folder, edit its captions (undoable), undo")
    verbs = ds.add_subparsers(dest="dataset_command", required=True)
    check = verbs.add_parser("check", help="flags (unreadable, too small, duplicates…) of every image")
    check.add_argument("folder")
    check.add_argument("--json", action="store_true", help="print the report as JSON")
    defaults = CheckSettings()
    check.add_argument("--resolution", type=int, default=defaults.resolution)
    check.add_argument("--bucketing", action="store_true")
    check.add_argument("--bucket-min-side", type=int, default=0)
    check.add_argument("--bucket-max-side", type=int, default=0)
    check.add_argument("--bucket-step", type=int, default=defaults.bucket_step)
    check.add_argument("--random-crop", action="store_true", help="the run uses a random crop (center_crop = false)")
    check.add_argument("--caption-extension", default=defaults.caption_extension)
    check.add_argument("--max-aspect", type=float, default=defaults.max_aspect)
    check.add_argument("--near-threshold", type=int, default=defaults.near_threshold,
                       help="perceptual-hash bits (of 64) near duplicates may differ in")
    check.add_argument("--cache", default=None, help="keep the index and thumbnails here (reused next time)")
    edit = verbs.add_parser("edit", help="one caption edit over every image (one undoable journal entry)")
    edit.add_argument("folder")
    what = edit.add_mutually_exclusive_group(required=True)
    what.add_argument("--prepend", metavar="TEXT")
    what.add_argument("--append", metavar="TEXT")
    what.add_argument("--replace", nargs=2, metavar=("OLD", "NEW"))
    what.add_argument("--remove-tag", metavar="TAG")
    what.add_argument("--rename-tag", nargs=2, metavar=("OLD", "NEW"))
    edit.add_argument("--regex", action="store_true", help="--replace OLD is a regular expression")
    edit.add_argument("--separator", default=",", help="tag separator (default ,)")
    edit.add_argument("--caption-extension", default=".txt")
    edit.add_argument("--dry-run", action="store_true", help="print the preview and change nothing")
    back = verbs.add_parser("undo", help="undo the newest caption edit (or --entry ID)")
    back.add_argument("folder")
    back.add_argument("--entry", default=None)
    back.add_argument("--list", action="store_true", help="list the journal instead")
    back.add_argument("--force", action="store_true", help="undo even over captions changed since")
    index = verbs.add_parser("index", help="make the thumbnails and the index of a folder (background job)")
    index.add_argument("folder")
    index.add_argument("--cache", required=True)


def operation_of(args) -> Operation:
    sep = args.separator
    if args.prepend is not None:
        return Operation("prepend", args.prepend, separator=sep)
    if args.append is not None:
        return Operation("append", args.append, separator=sep)
    if args.replace is not None:
        return Operation("replace", args.replace[0], args.replace[1], regex=args.regex, separator=sep)
    if args.remove_tag is not None:
        return Operation("remove_tag", args.remove_tag, separator=sep)
    return Operation("rename_tag", args.rename_tag[0], args.rename_tag[1], separator=sep)


def _folder(raw: str) -> Path:
    folder = Path(raw).expanduser()
    if not folder.is_dir():
        raise EditError(f"{raw}: no such dataset folder")
    return folder


def check_folder(folder: Path, settings: CheckSettings, cache: Path | None = None, progress=None) -> dict:
    """`dataset check`'s report (a dict; see checks.report)."""
    records = build_index(folder, cache, progress=progress)
    return report(folder, *annotate(folder, records, settings))


def _print_check(result: dict) -> None:
    clips = f", {result['clips']} clips" if result.get("clips") else ""
    print(f"{result['folder']}: {result['images']} images{clips}, {result['captioned']} captioned")
    for key in ("unreadable", "too_small", "uncaptioned", "extreme_aspect", "crop_cuts", "animated", "caption"):
        if result[key]:
            print(f"  {key}: {len(result[key])} ({', '.join(result[key][:3])}{' …' if len(result[key]) > 3 else ''})")
    for group in result["duplicate_groups"]:
        print(f"  {group['kind']} duplicates: {', '.join(group['paths'])}")


def run(args) -> int:
    try:
        folder = _folder(args.folder)
        if args.dataset_command == "check":
            settings = CheckSettings(args.resolution, args.bucketing, args.bucket_min_side, args.bucket_max_side,
                                     args.bucket_step, False, not args.random_crop, args.caption_extension,
                                     args.max_aspect, args.near_threshold)
            result = check_folder(folder, settings, Path(args.cache) if args.cache else None)
            print(json.dumps(result, indent=1)) if args.json else _print_check(result)
        elif args.dataset_command == "edit":
            from .index import list_media
            op = operation_of(args)
            images = [p.relative_to(folder).as_posix() for p in list_media(folder)]   # clips' captions too
            changes = plan_edit(folder, images, op, args.caption_extension)
            print(preview(changes))
            if changes and not args.dry_run:
                print(f"journal entry {apply_plan(folder, changes, op.label())} (undo: dataset undo {folder})")
        elif args.dataset_command == "undo":
            if args.list:
                for e in entries(folder):
                    print(f"{e.id}  {'undone ' if e.undone else ''}{e.label} ({e.files} files)")
                return 0
            entry = undo(folder, args.entry, force=args.force)
            print(f"undone: {entry.label} ({entry.files} files, entry {entry.id})")
        elif args.dataset_command == "index":
            def progress(done: int, total: int) -> None:
                if done == total or done % 50 == 0:
                    print(json.dumps({"done": done, "total": total}), flush=True)
            build_index(folder, Path(args.cache), progress=progress)
        return 0
    except (EditError, JournalError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer_backend")
    add_parser(parser.add_subparsers(dest="command", required=True))
    return run(parser.parse_args(argv))
