"""``payauth-dev`` (also ``python -m service.devtools``): the developers' commands, kept out
of the runtime's ``payauth`` command and out of the image.

- ``worker``: ``payauth run`` with the fault-injecting adapters the environment asks for
  (``PAYAUTH_TEST_FAULT_POINT``, ``PAYAUTH_TEST_UNSAFE_ORDERING``; see ``faults``).
- ``demo``: the end-to-end demo on the local stack (``make demo``).
- ``check LOG``: the chaos checker, holding the topics, the database and Redis against a
  load generator's ground-truth log.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from service.cli import run_command
from service.config import Settings


def _cmd_worker(settings: Settings, _args: argparse.Namespace) -> int:
    from service.devtools.entry import run_faulty_worker

    return run_faulty_worker(settings)


def _cmd_demo(settings: Settings, args: argparse.Namespace) -> int:
    from service.devtools.demo import run_demo

    return run_demo(settings, transactions=args.transactions, accounts=args.accounts,
                    seed=args.seed, log_dir=Path(args.log_dir),
                    ports=tuple(int(p) for p in args.metrics_ports.split(",")))


def _cmd_check(settings: Settings, args: argparse.Namespace) -> int:
    from service.devtools.chaos.checker import check

    result = check(settings, Path(args.log), redis_prefix=args.redis_prefix)
    print(result.render())
    return 0 if result.ok else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="payauth-dev",
                                     description="payauth's developer tools (not shipped).")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("worker", help="a worker with the fault injectors PAYAUTH_TEST_* ask for")
    p.set_defaults(func=_cmd_worker)

    p = sub.add_parser("demo", help="the end-to-end demo on the local stack (make demo)")
    p.add_argument("--transactions", type=int, default=3000)
    p.add_argument("--accounts", type=int, default=200)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--log-dir", default=".demo")
    p.add_argument("--metrics-ports", default="9101,9102", help="the two workers' ports")
    p.set_defaults(func=_cmd_demo)

    p = sub.add_parser("check", help="hold topics, DB and Redis against a generator's log")
    p.add_argument("log", metavar="LOG")
    p.add_argument("--redis-prefix", help="check Redis keys dedup:PREFIX*")
    p.set_defaults(func=_cmd_check)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(build_parser(), argv)
