"""The command line: ``python -m deploy.loopback_stack up|check|down`` (see the package).

``up`` that fails tears down what it made before exiting, so a failed run leaves nothing
behind; a ``StackError`` is one line on stderr and exit status 1, anything else a traceback.
"""

import argparse
import json
import sys
from collections.abc import Iterable
from pathlib import Path

from . import __doc__ as package_doc
from .layout import DEFAULT_DIR
from .nginx import WORKER_CONNECTIONS
from .report import StackError
from .stack import LoopbackStack
from .units import add_server_option


def parse(argv: Iterable[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m deploy.loopback_stack", description=(package_doc or "").split("\n\n")[0]
    )
    parser.add_argument("action", choices=["up", "check", "down"])
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR, help=f"default {DEFAULT_DIR}")
    parser.add_argument("--workers", type=int, default=2, help="workers (up only)")
    add_server_option(parser)  # up only
    parser.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a line of the environment file, after the loopback's own (up only; repeatable)",
    )
    parser.add_argument(
        "--worker-connections",
        type=int,
        default=WORKER_CONNECTIONS,
        help=f"nginx's worker_connections (up only; default {WORKER_CONNECTIONS})",
    )
    args = parser.parse_args(list(argv) if argv is not None else None)
    if bad := [item for item in args.env if "=" not in item]:
        parser.error(f"--env wants NAME=VALUE, not {bad[0]!r}")
    return args


def up(args: argparse.Namespace) -> None:
    stack = LoopbackStack(
        args.dir,
        workers=args.workers,
        server=args.server,
        env=dict(item.split("=", 1) for item in args.env),
        worker_connections=args.worker_connections,
    )
    try:
        stack.up()
    except BaseException:
        stack.down()
        raise
    print(stack.url)


def main(argv: Iterable[str] | None = None) -> int:
    args = parse(argv)
    try:
        if args.action == "up":
            up(args)
        else:
            stack = LoopbackStack.load(args.dir)
            if args.action == "check":
                print(json.dumps(stack.check(), indent=2))
            else:
                stack.down()
    except StackError as exc:
        print(f"{args.action} failed: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
