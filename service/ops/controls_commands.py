"""The card controls' commands on the command line (``payauth cards load|status``,
``payauth limits load|show``, ``payauth blocks load|lift|show``): their parsers and what each
runs. The commands themselves are ``cards.py``, ``limits.py`` and ``blocks.py``, imported
when one runs (they bring the database client)."""

from __future__ import annotations

import argparse
from typing import Any

from service.config import Settings


def _cards_load(settings: Settings, args: argparse.Namespace) -> int:
    from service.ops import cards
    return cards.load_command(settings, args.file)


def _cards_status(settings: Settings, args: argparse.Namespace) -> int:
    from service.ops import cards
    return cards.status_command(settings, args.card_id, args.status, args.reason, args.by)


def _limits_load(settings: Settings, args: argparse.Namespace) -> int:
    from service.ops import limits
    return limits.load_command(settings, args.file)


def _limits_show(settings: Settings, args: argparse.Namespace) -> int:
    from service.ops import limits
    return limits.show_command(settings, args.card, args.account)


def _blocks_load(settings: Settings, args: argparse.Namespace) -> int:
    from service.ops import blocks
    return blocks.change_command(settings, args.file, lift=False)


def _blocks_lift(settings: Settings, args: argparse.Namespace) -> int:
    from service.ops import blocks
    return blocks.change_command(settings, args.file, lift=True)


def _blocks_show(settings: Settings, args: argparse.Namespace) -> int:
    from service.ops import blocks
    return blocks.show_command(settings, args.card, args.account)


def add_parsers(sub: Any) -> None:
    """``cards``, ``limits`` and ``blocks`` with their subcommands, on the command line's
    subparsers."""
    group = sub.add_parser("cards", help="card tools").add_subparsers(
        dest="cards_command", required=True)
    p = group.add_parser("load", help="add the cards of a CSV file (card_id,account_id"
                                      "[,status,expires_on]); never changes an existing card")
    p.add_argument("file", metavar="FILE.csv")
    p.set_defaults(func=_cards_load)
    p = group.add_parser("status", help="set a card's status (ACTIVE, FROZEN, LOST, STOLEN, "
                                        "CLOSED), keeping who asked and why")
    p.add_argument("card_id", metavar="CARD_ID")
    p.add_argument("status", metavar="STATUS")
    p.add_argument("--reason", required=True, help="why (kept with the change)")
    p.add_argument("--by", help="who asked (default: the operating-system user)")
    p.set_defaults(func=_cards_status)

    group = sub.add_parser("limits", help="spending limit tools").add_subparsers(
        dest="limits_command", required=True)
    p = group.add_parser("load", help="add or re-set the spending limits of a CSV file "
                                      "(limit_id,scope,scope_id,period,max_amount,max_count"
                                      "[,merchant_category])")
    p.add_argument("file", metavar="FILE.csv")
    p.set_defaults(func=_limits_load)
    p = group.add_parser("show", help="the limits of a card or account, with their usage in "
                                      "the period now")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--card", metavar="ID")
    which.add_argument("--account", metavar="ID")
    p.set_defaults(func=_limits_show)

    group = sub.add_parser("blocks", help="blocked merchant categories and countries").\
        add_subparsers(dest="blocks_command", required=True)
    p = group.add_parser("load", help="block what a CSV file names (scope,scope_id,kind,value: "
                                      "CARD or ACCOUNT, CATEGORY 7995 or COUNTRY KP)")
    p.add_argument("file", metavar="FILE.csv")
    p.set_defaults(func=_blocks_load)
    p = group.add_parser("lift", help="lift the blocks a CSV file names (the same columns)")
    p.add_argument("file", metavar="FILE.csv")
    p.set_defaults(func=_blocks_lift)
    p = group.add_parser("show", help="the blocks that judge a card's messages, or an "
                                      "account's and its cards'")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--card", metavar="ID")
    which.add_argument("--account", metavar="ID")
    p.set_defaults(func=_blocks_show)
