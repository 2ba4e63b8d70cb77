"""The ``payauth`` command (also ``python -m service``)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from pathlib import Path

from service.config import ConfigError, Settings, load_settings
from service.logs import configure_logging


def _cmd_run(settings: Settings, _args: argparse.Namespace) -> int:
    from service.worker import run_worker

    return asyncio.run(run_worker(settings))


def _cmd_migrate(settings: Settings, args: argparse.Namespace) -> int:
    from service.migrate import MIGRATIONS_DIR, migrate

    directory = Path(args.dir) if args.dir else MIGRATIONS_DIR
    applied = asyncio.run(migrate(settings.database_url.get_secret_value(), directory))
    print(f"migrate: applied {', '.join(applied)}" if applied else "migrate: up to date")
    return 0


def _cmd_verify(settings: Settings, _args: argparse.Namespace) -> int:
    from service.verify import report, verify

    text, ok = report(asyncio.run(verify(settings.database_url.get_secret_value())))
    print(text)
    return 0 if ok else 1


def _cmd_topics(settings: Settings, args: argparse.Namespace) -> int:
    from service.topics import ensure_topics

    created = ensure_topics(settings, partitions=args.partitions, wait_seconds=args.wait)
    print(f"topics: created {', '.join(created)}" if created else "topics: all present")
    return 0


def _cmd_demo(settings: Settings, args: argparse.Namespace) -> int:
    from service.demo import run_demo

    return run_demo(settings, transactions=args.transactions, accounts=args.accounts,
                    seed=args.seed, log_dir=Path(args.log_dir),
                    ports=tuple(int(p) for p in args.metrics_ports.split(",")))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="payauth",
        description="Card payment authorization from Kafka, exactly once in effect.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("run", help="run one worker until SIGTERM/SIGINT")
    p.set_defaults(func=_cmd_run)

    p = sub.add_parser("migrate", help="apply migrations/*.sql, each once")
    p.add_argument("--dir", help="migrations directory (default: the packaged one)")
    p.set_defaults(func=_cmd_migrate)

    p = sub.add_parser("verify", help="check the money invariants; exit 0 only if all hold")
    p.set_defaults(func=_cmd_verify)

    p = sub.add_parser("topics", help="create the input, output and dead-letter topics")
    p.add_argument("--partitions", type=int, default=12)
    p.add_argument("--wait", type=float, default=60, help="seconds to wait for the broker")
    p.set_defaults(func=_cmd_topics)

    p = sub.add_parser("demo", help="the end-to-end demo on the local stack (make demo)")
    p.add_argument("--transactions", type=int, default=3000)
    p.add_argument("--accounts", type=int, default=200)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--log-dir", default=".demo")
    p.add_argument("--metrics-ports", default="9101,9102", help="the two workers' ports")
    p.set_defaults(func=_cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        settings = load_settings()
    except ConfigError as exc:
        print(f"payauth: {exc}", file=sys.stderr)
        return 2
    configure_logging(settings.log_format, settings.log_level)
    result: int = args.func(settings, args)
    return result
