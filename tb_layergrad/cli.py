"""`tb-layergrad` command line: `demo` (and later `report`)."""
from __future__ import annotations

import argparse
import sys
from typing import List, Optional


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tb-layergrad", description="Layer-output gradients in TensorBoard.")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="train small built-in models that write gradients, optionally serve them")
    demo.add_argument("--logdir", default="layergrad_demo", help="where to write the runs (default: %(default)s)")
    demo.add_argument("--serve", action="store_true", help="then start TensorBoard on the logdir")
    demo.add_argument("--port", type=int, default=6006, help="TensorBoard port with --serve (default: %(default)s)")
    demo.add_argument("--quick", action="store_true", help="fewer steps (for tests and a first look)")
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "demo":
        from tb_layergrad import demo

        return demo.main(args.logdir, quick=args.quick, do_serve=args.serve, port=args.port)
    return 2


if __name__ == "__main__":
    sys.exit(main())
