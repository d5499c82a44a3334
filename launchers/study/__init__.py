"""Studies over traced steps: ``python -m launchers.study trace|bucket|scale ...``.

One module per question, each adding its subcommand to one parser, over one shared runner
(:mod:`._runner`: points -> planner -> rows -> CSV / JSON / PNG / summary):

- :mod:`.trace`: one training step traced without data, summarised and written as JSON;
- :mod:`.bucket`: which ``bucket_cap_mb`` at which scale (table, plot, recommendation)::

    python -m launchers.study bucket --model resnet50 --batch-size 256 \\
        --world-sizes 8,64,512 --bucket-cap-mb 1,2,5,10,25,50,100 --topology hls2 --out study/

- :mod:`.scale`: how the model scales, and where the efficiency goes::

    python -m launchers.study scale --model bert-large --batch-size 48 --seq-len 512 \\
        --world-sizes 8,16,32,64,128,256,512,1024,4096 --topology hls2 --out scale/

Bad input is refused before any work, with exit code 2 and a message naming it.
"""

from __future__ import annotations

import argparse
import sys

from . import bucket, scale, trace
from .bucket import bucket_main
from .trace import trace_json

__all__ = ["main", "build_parser", "trace_json", "bucket_main"]


def build_parser() -> argparse.ArgumentParser:
    """The ``launchers.study`` parser with one subcommand per study module."""
    p = argparse.ArgumentParser(prog="python -m launchers.study", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    trace.add_parser(sub)
    bucket.add_parser(sub)
    scale.add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` and run the study it names; returns the exit code (2: bad input)."""
    args = build_parser().parse_args(argv)
    try:
        if args.command == "bucket":
            bucket.print_result(bucket_main(args))
            return 0
        if args.command == "scale":
            scale.print_result(scale.scale_main(args))
            return 0
        return trace.run(args)
    except (ValueError, NotImplementedError) as exc:
        print(f"launchers.study {args.command}: error: {exc}", file=sys.stderr)
        return 2
