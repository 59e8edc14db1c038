"""``python -m pydotcompute {info, demo, bench, top}``."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path


def _demo() -> int:
    from ._demo import main as demo_main

    return demo_main()


def _bench(args: list[str]) -> int:
    script = Path(__file__).resolve().parent.parent / "benchmarks" / "run_all.py"
    if not script.exists():
        print("benchmarks/ is not available in this installation (it ships with the source tree)")
        return 2
    return subprocess.call([sys.executable, str(script), *args])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pydotcompute")
    sub = parser.add_subparsers(dest="command")
    sub.add_parser("info", help="print versions, loop, tiers and backends")
    sub.add_parser("demo", help="run the quick-start actor")
    sub.add_parser(
        "bench", help="run the benchmark suite (see benchmarks/run_all.py --help)", add_help=False
    )
    sub.add_parser(
        "top",
        help="live view of the kernels behind a metrics URL (see top --help)",
        add_help=False,
    )
    args, rest = parser.parse_known_args(argv)
    if args.command == "info" or args.command is None:
        from . import show_config

        show_config()
        return 0
    if args.command == "demo":
        return _demo()
    if args.command == "bench":
        return _bench(rest)
    if args.command == "top":
        from .observability.top import main as top_main

        return top_main(rest)
    parser.print_help()
    return 2


if __name__ == "__main__":
    sys.exit(main())
