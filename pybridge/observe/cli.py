"""`pybridge`: the command over a traced run's directory (docs/observability.md).

    pybridge report DIR [--out DIR/report] [--steps 3] [--window 20] [--skip-steps 0]
                        [--link-gbps X] [--no-charts] [--json]
    pybridge merge DIR

Imports neither torch nor, unless charts are drawn, matplotlib.
"""

import argparse
import json
import os
import sys

from .._version import __version__
from ..errors import InvalidArgument, PyBridgeError

PROG = "pybridge"


def _positive(what, least=1):
    def parse(text):
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{what}: expected a whole number, got {text!r}") from None
        if n < least:
            raise argparse.ArgumentTypeError(f"{what}: must be >= {least}, got {n}")
        return n
    return parse


def _gbps(text):
    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected GB/s as a number, got {text!r}") from None
    if not x > 0 or x == float("inf"):
        raise argparse.ArgumentTypeError(f"the link's limit must be a positive number of GB/s, got {text!r}")
    return x


def _parser():
    p = argparse.ArgumentParser(prog=PROG, description="Read what a traced pybridge run recorded "
                                "(pybridge-launch --trace DIR, PYBRIDGE_TRACE=DIR or observe.start(DIR)).")
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    r = sub.add_parser("report", help="step breakdown, bandwidth and stragglers of a traced run; charts and HTML",
                       description="Analyze a traced run: each rank's step time (compute, exposed communication, "
                       "data wait), bus bandwidth per collective and message size, and which rank is the "
                       "straggler and why. Prints the tables and writes report.json, the charts (PNG, SVG) "
                       "and report.html.")
    r.add_argument("dir", help="the run's trace directory (rank<N>.trace.json files)")
    r.add_argument("--out", help="where the files go (default DIR/report)")
    r.add_argument("--steps", type=_positive("--steps"), default=3,
                   help="steps in the timeline chart: the last ones every rank took (default 3)")
    r.add_argument("--window", type=_positive("--window"), default=20,
                   help="steps per straggler-score window (default 20)")
    r.add_argument("--skip-steps", type=_positive("--skip-steps", 0), default=0, metavar="N",
                   help="leave the first N steps out (step 1 holds the start-up; default 0)")
    r.add_argument("--link-gbps", type=_gbps, metavar="GB/s",
                   help="the link's peak in GB/s, gigabytes per second (not Gbit/s: 100 Gbit/s Ethernet is 12.5): "
                   "a line on the bandwidth chart")
    r.add_argument("--no-charts", action="store_true", help="no charts (and no need for matplotlib)")
    r.add_argument("--json", action="store_true", help="print report.json's content instead of the tables")
    r.set_defaults(run=cmd_report)

    m = sub.add_parser("merge", help="merge the ranks' traces into DIR/trace.json on rank 0's clock")
    m.add_argument("dir", help="the run's trace directory")
    m.set_defaults(run=cmd_merge)
    return p


def cmd_report(args, out):
    from . import report
    rep = report.analyze(args.dir, window=args.window, skip=args.skip_steps)
    dest = args.out or os.path.join(args.dir, "report")
    try:
        os.makedirs(dest, exist_ok=True)
    except OSError as exc:
        raise InvalidArgument(f"cannot create the output directory {dest}: {exc.strerror or exc}") from None
    files = [report.write_json(rep, os.path.join(dest, "report.json"))]
    from . import charts
    drawn = {}
    if not args.no_charts:
        drawn = charts.draw(rep, dest, steps=args.steps, link_gbps=args.link_gbps)
        files += [p for name in charts.NAMES for p in (drawn[name]["png"], drawn[name]["svg"])]
    files.append(charts.write_html(rep, dest, drawn))
    if args.json:
        json.dump(rep, out, indent=1)
        out.write("\n")
        return 0
    out.write(report.text(rep))
    out.write("\nFiles:\n" + "".join(f"  {p}\n" for p in files))
    return 0


def cmd_merge(args, out):
    from . import merge, report
    report.merged_trace(args.dir)  # the checks: a directory, rank files, none corrupt
    summary = merge.merge(args.dir)
    out.write(merge.describe(summary) + "\n")
    return 0


def main(argv=None):
    args = _parser().parse_args(argv)
    try:
        return args.run(args, sys.stdout)
    except PyBridgeError as exc:
        print(f"{PROG} {args.command}: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `pybridge report DIR | head`
        return 0


if __name__ == "__main__":
    sys.exit(main())
