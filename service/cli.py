"""The ``payauth`` command (also ``python -m service``).

Every answer to a bad flag or an engine that refuses is one line on stderr, never a
traceback: flags are checked by their argparse types before anything connects, and a
library error that ends an operator command is named in ``run_command``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NoReturn

from service.config import ConfigError, Settings, load_settings
from service.logs import configure_logging, mask_secrets
from service.ops import controls_commands, flags


class _Parser(argparse.ArgumentParser):
    """argparse, with a usage error in one line (the usage itself is behind --help)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")




def _cmd_run(settings: Settings, _args: argparse.Namespace) -> int:
    from service.worker import run_worker

    return asyncio.run(run_worker(settings))


def _cmd_migrate(settings: Settings, args: argparse.Namespace) -> int:
    from service.ops import migrate

    return migrate.command(settings, args.dir, args.sql_dir)


def _cmd_verify(settings: Settings, args: argparse.Namespace) -> int:
    from service.ops.verify import report, verify

    text, ok = report(asyncio.run(verify(settings.database_url.get_secret_value())))
    print(text)
    return 0 if ok else 1


def _cmd_topics(settings: Settings, args: argparse.Namespace) -> int:
    from service.ops.topics import ensure_topics

    created = ensure_topics(settings, partitions=args.partitions, wait_seconds=args.wait)
    print(f"topics: created {', '.join(created)}" if created else "topics: all present")
    return 0


def _cmd_acls(settings: Settings, args: argparse.Namespace) -> int:
    from service.ops import acls

    principal = args.principal
    wanted = acls.worker_acls(settings)
    mode = "EXECUTE" if args.execute else "dry run (--execute to create)"
    print(f"acls for {principal} as a worker of group {settings.group_id}: {mode}")
    for acl in wanted:
        print(f"  {acl.render(principal)}")
    if args.execute:
        try:
            created = acls.create(settings, wanted, principal)
        except acls.AclsRefused as exc:
            print(f"payauth acls: {exc}", file=sys.stderr)
            return 1
        print(f"acls: created {created} (existing ones unchanged)")
    return 0


def _cmd_replay(settings: Settings, args: argparse.Namespace) -> int:
    import asyncpg

    from service.ops import replay

    if args.shadow:
        return _shadow_replay(settings, args)
    chosen = [args.to_datetime is not None, args.to_earliest, args.shift_by is not None,
              args.from_offset is not None]
    if sum(chosen) != 1 or args.to_offset is not None or args.transactions or args.json:
        print("payauth replay: give exactly one of --to-datetime, --to-earliest, --shift-by, "
              "--from-offset (--to-offset, --transactions and --json go with --shadow: a "
              "replay re-reads to the end of each partition)", file=sys.stderr)
        return 2
    try:
        if args.shift_by is not None and args.shift_by > 0 and not args.force:
            raise replay.ReplayRefused(
                f"refusing: --shift-by {args.shift_by} skips messages forward, which would "
                "leave them unprocessed; pass --force if that is what you want")
        members = replay.active_members(settings)
        if members:
            raise replay.ReplayRefused(
                f"refusing: group {settings.group_id} has {len(members)} active member(s) "
                f"({', '.join(members)}); stop the workers first (scale to 0), then replay")
        plans = _replay_plans(settings, args)
        mode = "EXECUTE" if args.execute else "dry run (--execute to apply)"
        print(replay.render(plans, f"replay of {settings.input_topic} for group "
                                   f"{settings.group_id}: {mode}"))
        if not args.force:
            replay.check_window(plans, settings.dedup_retention_hours, now=datetime.now(UTC))
        if args.execute:
            committed = replay.execute(settings, plans)
            print("replay: committed offsets now " + ", ".join(
                f"{p}={o}" for p, o in sorted(committed.items())))
            try:
                marks = asyncio.run(replay.write_marks(
                    settings.database_url.get_secret_value(), settings, plans))
                print(f"replay: {marks} replay mark(s) written: the workers will count the "
                      "re-read duplicates as cause replay")
            except (OSError, asyncpg.PostgresError) as exc:
                print(f"payauth replay: replay marks not written ({type(exc).__name__}); the "
                      "re-read duplicates will count as redeliveries", file=sys.stderr)
    except replay.ReplayRefused as exc:
        print(f"payauth replay: {exc}", file=sys.stderr)
        return 1
    return 0


def _replay_plans(settings: Settings, args: argparse.Namespace) -> list[Any]:
    from service.ops import replay

    return replay.build_plan(
        settings,
        to_datetime=args.to_datetime,
        to_earliest=args.to_earliest,
        shift_by=args.shift_by,
        from_offset=args.from_offset,
        partitions=args.partitions,
    )


def _shadow_replay(settings: Settings, args: argparse.Namespace) -> int:
    """Exit 0: nothing would change; 3: something would; 1: could not tell; 2: usage."""
    import asyncpg
    from confluent_kafka import KafkaException

    from service.ops import replay, shadow

    by_plan = [args.to_datetime is not None, args.to_earliest, args.shift_by is not None]
    by_offsets = args.from_offset is not None or args.to_offset is not None
    if sum(by_plan) + by_offsets + bool(args.transactions) != 1 or args.execute:
        print("payauth replay --shadow: give exactly one of --to-datetime, --to-earliest, "
              "--shift-by, --from-offset/--to-offset, --transactions (and no --execute: a "
              "shadow replay writes nothing)", file=sys.stderr)
        return 2
    partitions = args.partitions
    try:
        ids = _transaction_ids(args.transactions) if args.transactions else None
    except OSError as exc:
        print(f"payauth replay --shadow: cannot read {args.transactions[1:]}: "
              f"{exc.strerror}", file=sys.stderr)
        return 2
    try:
        if ids is not None:
            report = asyncio.run(shadow.shadow(settings, transaction_ids=ids))
        else:
            if by_offsets:
                ranges = shadow.ranges_of_offsets(settings, args.from_offset, args.to_offset,
                                                  partitions)
            else:
                ranges = shadow.ranges_of_plans(_replay_plans(settings, args))
            report = asyncio.run(shadow.shadow(settings, ranges=ranges))
    except replay.ReplayRefused as exc:
        print(f"payauth replay --shadow: {exc}", file=sys.stderr)
        return 1
    except KafkaException as exc:
        print(f"payauth replay --shadow: {_engine_refusal(exc)}", file=sys.stderr)
        return 1
    except asyncpg.InsufficientPrivilegeError as exc:
        print(f"payauth replay --shadow: the database role may not do this ({exc}); it needs "
              "the worker role's grants (EXECUTE on payauth_decide, SELECT)", file=sys.stderr)
        return 1
    except (OSError, asyncpg.PostgresError) as exc:
        print(f"payauth replay --shadow: the database did not answer ({type(exc).__name__}: "
              f"{exc})", file=sys.stderr)
        return 1
    print(report.render())
    if args.json:
        report.write_json(Path(args.json))
    return 3 if report.would_change else 0


def _transaction_ids(text: str) -> list[str]:
    """A comma-separated list, or @FILE with one id per line."""
    if text.startswith("@"):
        lines = Path(text[1:]).read_text().splitlines()
        return [line.strip() for line in lines if line.strip()]
    return [t.strip() for t in text.split(",") if t.strip()]


def _cmd_dlq_redrive(settings: Settings, args: argparse.Namespace) -> int:
    from service.ops import redrive

    letters = redrive.read_dead_letters(
        settings, reason=args.reason, from_offset=args.from_offset, to_offset=args.to_offset,
        partitions=args.partitions,
    )
    print(redrive.summarize(letters, execute=args.execute))
    if args.execute and letters:
        letters, missing = redrive.with_originals(settings, letters)
        for line in missing:
            print(f"dlq: {line}", file=sys.stderr)
        sent = redrive.redrive(settings, letters) if letters else 0
        print(f"dlq: redrove {sent} message(s) to {settings.input_topic}")
        return 1 if missing else 0
    return 0


def _cmd_explain(settings: Settings, args: argparse.Namespace) -> int:
    from service.ops.explain import explain

    result = asyncio.run(explain(settings.database_url.get_secret_value(), args.transaction_id))
    print(result.render())
    return 0 if result.known else 1


def _cmd_accounts_load(settings: Settings, args: argparse.Namespace) -> int:
    from service.ops import accounts, csv_file

    rows = csv_file.read_or_report("accounts", args.file, accounts.read)
    if rows is None:
        return 1
    report = asyncio.run(accounts.load(settings.database_url.get_secret_value(), rows))
    print(report.render())
    return 0


def _cmd_purge(settings: Settings, args: argparse.Namespace) -> int:
    from service.ops.purge import purge_command

    deleted = asyncio.run(purge_command(settings, batch_size=args.batch_size,
                                        pause_seconds=args.pause))
    print(f"purge: deleted {deleted} dedup record(s) older than "
          f"{settings.dedup_retention_hours:g} h")
    return 0


def _cmd_holds_expire(settings: Settings, args: argparse.Namespace) -> int:
    from service.ops import holds
    return holds.command(settings, execute=args.execute)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="payauth",
        description="Card payment authorization from Kafka, exactly once in effect.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("run", help="run one worker until SIGTERM/SIGINT")
    p.set_defaults(func=_cmd_run)

    p = sub.add_parser("migrate", help="apply migrations/*.sql, each once, then the "
                                       "functions and views of sql/ that changed")
    p.add_argument("--dir", type=flags.directory,
                   help="migrations directory (default: the packaged one)")
    p.add_argument("--sql-dir", type=flags.directory,
                   help="definitions directory (default: the packaged one)")
    p.set_defaults(func=_cmd_migrate)

    p = sub.add_parser("verify", help="check the money invariants; exit 0 only if all hold")
    p.set_defaults(func=_cmd_verify)

    p = sub.add_parser("topics", help="create the input, output and dead-letter topics")
    p.add_argument("--partitions", type=flags.whole(1, "a partition count (1 or more)"),
                   default=12)
    p.add_argument("--wait", type=flags.seconds, default=60,
                   help="seconds to wait for the broker")
    p.set_defaults(func=_cmd_topics)

    p = sub.add_parser("acls", help="the Kafka ACLs a worker principal needs (dry run); "
                                    "--execute creates them")
    p.add_argument("--principal", required=True, metavar="User:NAME", type=flags.principal)
    p.add_argument("--execute", action="store_true")
    p.set_defaults(func=_cmd_acls)

    p = sub.add_parser("replay", help="rewind the group's committed offsets (dry run default); "
                                      "--shadow: what the rule now would change")
    p.add_argument("--to-datetime", type=flags.iso_datetime,
                   help="ISO 8601; UTC when no zone")
    p.add_argument("--to-earliest", action="store_true")
    p.add_argument("--shift-by", type=flags.shift,
                   help="-N: re-read the last N messages per partition")
    p.add_argument("--from-offset", type=flags.offset,
                   help="rewind to this offset in each partition")
    p.add_argument("--to-offset", type=flags.offset,
                   help="with --shadow: the last offset compared")
    p.add_argument("--partitions", type=flags.partition_list,
                   help="comma-separated partition numbers (default: all)")
    p.add_argument("--execute", action="store_true", help="apply the plan")
    p.add_argument("--force", action="store_true",
                   help="allow a target older than the dedup retention window")
    p.add_argument("--shadow", action="store_true",
                   help="decide the range again with the rule as it is now and show what would "
                        "change; writes nothing, safe while the workers run (exit 3: something "
                        "would change)")
    p.add_argument("--transactions", metavar="IDS|@FILE",
                   help="with --shadow: these transaction ids instead of a range")
    p.add_argument("--json", metavar="FILE", help="with --shadow: the report as JSON too")
    p.set_defaults(func=_cmd_replay)

    p = sub.add_parser("purge", help="remove dedup records older than the retention window: "
                                      "whole days dropped, the rest row by row")
    p.add_argument("--batch-size", type=flags.whole(1, "a batch size (1 or more)"),
                   default=5000, help="rows a batch, where records go row by row")
    p.add_argument("--pause", type=flags.seconds, default=0.05, help="seconds between batches")
    p.set_defaults(func=_cmd_purge)

    p = sub.add_parser("explain", help="one transaction's decision, source, event and ledger "
                                       "entry (exit 1 when unknown)")
    p.add_argument("transaction_id", metavar="TXN_ID")
    p.set_defaults(func=_cmd_explain)

    group = sub.add_parser("accounts", help="account tools").add_subparsers(
        dest="accounts_command", required=True)
    p = group.add_parser("load", help="open the accounts of a CSV file (account_id,balance,"
                                      "currency[,status]); never changes an existing balance")
    p.add_argument("file", metavar="FILE.csv")
    p.set_defaults(func=_cmd_accounts_load)

    controls_commands.add_parsers(sub)

    p = sub.add_parser("holds", help="hold tools").add_subparsers(dest="holds_command",
        required=True).add_parser("expire", help="end holds past the expiry (dry run)")
    p.add_argument("--execute", action="store_true")
    p.set_defaults(func=_cmd_holds_expire)

    dlq = sub.add_parser("dlq", help="dead-letter topic tools").add_subparsers(
        dest="dlq_command", required=True)
    p = dlq.add_parser("redrive", help="re-publish dead letters to the input topic (dry run)")
    p.add_argument("--reason", type=flags.reason,
                   help="only this error.reason, e.g. TOO_LARGE")
    p.add_argument("--from-offset", type=flags.offset)
    p.add_argument("--to-offset", type=flags.offset)
    p.add_argument("--partitions", type=flags.partition_list,
                   help="DLQ partitions, comma-separated")
    p.add_argument("--execute", action="store_true")
    p.set_defaults(func=_cmd_dlq_redrive)

    return parser


def run_command(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> int:
    """Parse, load the settings (a bad one: one line, exit 2), set up logging, run."""
    args = parser.parse_args(argv)
    try:
        settings = load_settings()
    except ConfigError as exc:
        print(f"{parser.prog}: {exc}", file=sys.stderr)
        return 2
    configure_logging(settings.log_format, settings.log_level, settings.secret_values())
    try:
        result: int = args.func(settings, args)
    except Exception as exc:
        refusal = _engine_refusal(exc)
        if refusal is None:
            raise
        command = " ".join(c for c in (args.command, getattr(args, "accounts_command", None),
                                       getattr(args, "cards_command", None),
                                       getattr(args, "limits_command", None),
                                       getattr(args, "dlq_command", None),
                                       getattr(args, "holds_command", None)) if c)
        print(mask_secrets(f"{parser.prog} {command}: {refusal}"), file=sys.stderr)
        return 1
    return result


def _engine_refusal(exc: Exception) -> str | None:
    """One line for an engine that did not answer or refused; None for anything else (a
    bug, which keeps its traceback). The libraries' texts name no password."""
    import asyncpg
    from confluent_kafka import KafkaError, KafkaException

    if isinstance(exc, asyncpg.PostgresError | asyncpg.InterfaceError):
        return f"PostgreSQL refused ({type(exc).__name__}: {str(exc)[:300]})"
    if isinstance(exc, KafkaException):
        error = exc.args[0] if exc.args else None
        if not isinstance(error, KafkaError):
            return f"Kafka refused ({exc})"
        unreachable = error.code() in (KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN,
                                       KafkaError._TIMED_OUT)
        return f"Kafka {'did not answer' if unreachable else 'refused'} ({error.str()})"
    if isinstance(exc, OSError | TimeoutError):
        return f"could not reach an engine ({type(exc).__name__}: {str(exc)[:300]})"
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """The runtime's command line: it imports no dev tool (``payauth-dev`` has those)."""
    return run_command(build_parser(), argv)
