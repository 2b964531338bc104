"""`tb-layergrad` command line: `demo` and `report` (also `python -m tb_layergrad`).

`report` and `--version` import no TensorFlow: they start fast and print nothing
but their own output. Only `demo`, which trains, loads it.
"""

from __future__ import annotations

import argparse
from typing import List, Optional

from tb_layergrad import __version__


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tb-layergrad", description="Layer-output gradients in TensorBoard.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser(
        "demo",
        help="train small built-in models that show classic gradient problems, optionally serve them",
        description="Train, on CPU, small runs that each show one classic behaviour (vanishing, dead, NaN, "
        "exploding, RNN timesteps) and write their gradients; --serve then opens TensorBoard on them.",
    )
    demo.add_argument("--logdir", default="layergrad_demo", help="where to write the runs (default: %(default)s)")
    demo.add_argument(
        "--serve", action="store_true", help="then start TensorBoard on the logdir and print the tab's URL"
    )
    demo.add_argument(
        "--port", type=int, default=None, help="TensorBoard port with --serve (default: the first free one from 6006)"
    )
    demo.add_argument(
        "--quick", action="store_true", help="fewer steps (well under a minute; for tests and a first look)"
    )
    from tb_layergrad.cli import report

    rep = sub.add_parser(
        "report",
        help="per run and layer: last norm, trend, zero fraction, first NaN step, anomaly flags",
        description="Read every step of the event files under LOGDIR and print, per run and layer, the anomaly "
        "verdicts of the tab (docs/ANOMALIES.md). Exit status 3 when a --fail-on condition holds (for CI), "
        "1 when there is nothing to report on.",
    )
    report.add_arguments(rep)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "demo":
        from tb_layergrad.cli import demo

        return demo.main(args.logdir, quick=args.quick, do_serve=args.serve, port=args.port)
    if args.command == "report":
        from tb_layergrad.cli import report

        return report.main(args)
    return 2
