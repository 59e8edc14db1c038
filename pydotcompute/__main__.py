"""``python -m pydotcompute {info, demo, bench, top}``.

Every error ends in one line on stderr that names the fix, never a traceback: usage errors
exit 2, a pydotcompute error (a missing extra, say) exits 1. Output into a pipe whose reader
went away (``... info | head -2``) ends quietly with status 141, as a shell reports a writer
stopped by SIGPIPE; Ctrl-C ends with 130.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from ._cli import OneLineParser
from .exceptions import PyDotComputeError

_PROG = "python -m pydotcompute"


def _demo() -> int:
    from ._demo import main as demo_main

    return demo_main()


def _bench(args: list[str]) -> int:
    script = Path(__file__).resolve().parent.parent / "benchmarks" / "run_all.py"
    if not script.exists():
        print(
            f"{_PROG} bench: benchmarks/ is not in this installation; it ships with the "
            "source tree: run it from a checkout of the repository",
            file=sys.stderr,
        )
        return 2
    return subprocess.call([sys.executable, str(script), *args])


def _dispatch(argv: list[str] | None) -> int:
    parser = OneLineParser(prog=_PROG)
    sub = parser.add_subparsers(dest="command", metavar="{info,demo,bench,top}")
    sub.add_parser("info", help="print versions, loop, tiers and backends")
    sub.add_parser("demo", help="run the quick-start actor")
    sub.add_parser("bench", help="run the benchmark suite (see bench --help)", add_help=False)
    sub.add_parser(
        "top",
        help="live view of the kernels behind a metrics URL (see top --help)",
        add_help=False,
    )
    args, rest = parser.parse_known_args(argv)
    if args.command == "bench":
        return _bench(rest)
    if args.command == "top":
        from .observability.top import main as top_main

        return top_main(rest)
    if rest:
        prog = f"{_PROG} {args.command}" if args.command else _PROG
        OneLineParser(prog=prog).error(f"unrecognized arguments: {' '.join(rest)}")
    if args.command == "demo":
        return _demo()
    from . import show_config

    show_config()
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status (see the module's docstring)."""
    try:
        status = _dispatch(argv)
        sys.stdout.flush()  # a closed pipe shows here, inside the handler, not at exit
        return status
    except BrokenPipeError:
        # Python flushes stdout once more on the way out: point it at /dev/null first
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 141
    except KeyboardInterrupt:
        return 130
    except PyDotComputeError as exc:
        print(f"{_PROG}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
