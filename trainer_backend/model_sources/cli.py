"""`python -m trainer_backend download org/name[@revision]`: fetch a hub model into the Hugging Face cache
ahead of a run (or just show the plan), with a progress line; exit 2 with one line on errors."""
from __future__ import annotations

import argparse
import sys


def add_parser(sub) -> None:
    p = sub.add_parser("download", help="download a hub model (org/name[@revision]) into the Hugging Face cache")
    p.add_argument("repo", help="org/name, org/name@revision or org/name/file.safetensors")
    p.add_argument("--kind", choices=("model", "files", "tokenizer"), default="model",
                   help="model: the files its family loads (default); files: the repo's files, one weight "
                        "variant per folder; tokenizer: tokenizer files only")
    p.add_argument("--allow", action="append", default=None, metavar="PATTERN",
                   help="only files matching this fnmatch pattern (repeatable); replaces --kind's choice")
    p.add_argument("--plan", action="store_true", help="print what would be downloaded and the free space, only")
    p.add_argument("--token-name", default="HF_TOKEN",
                   help="environment variable holding the token for gated/private repos (default HF_TOKEN)")


def run(args) -> int:
    import os
    from ..errors import ConfigError
    from ..run import exitcodes
    from . import parse_hub_spec, plan_model, printer, resolve_model
    token = os.environ.get(args.token_name) or None
    spec = parse_hub_spec(args.repo)
    if spec is None:
        raise ConfigError(f"repo: {args.repo!r} is not a hub repo id (org/name[@revision] or org/name/file.safetensors)")
    if args.plan:
        plan = plan_model(spec, key="repo", token=token, kind=args.kind, allow_patterns=args.allow)
        print(plan.line())
        for f in plan.files:
            print(f"  {'cached ' if f.cached else 'get    '} {f.size:>14,d}  {f.name}")
        return exitcodes.OK
    try:
        path = resolve_model(spec, allow_patterns=args.allow, progress=printer(sys.stderr, every_s=1.0), key="repo",
                             token=token, kind=args.kind)
    except KeyboardInterrupt:  # Ctrl-C: the partial file stays, the next run resumes it
        print(f"stopped: {spec}: start the same command again to resume the download", file=sys.stderr)
        return exitcodes.STOPPED_SAVED
    print(path)
    return exitcodes.OK
