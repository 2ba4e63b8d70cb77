"""The words payauth and its database share, defined once.

The decision itself lives in one place, the SQL function ``payauth_decide``
(``sql/payauth_decide.sql``); the schema's CHECKs bound what may be stored. Both spell
these values as SQL literals: ``tests/unit/test_vocabulary.py`` reads the migrations and
the definitions and holds every literal and CHECK to this module, so a value added or
renamed on one side only fails a test.

Each value is a ``StrEnum`` member, which is the string itself: code that runs per message
passes the member where a string is wanted (``.value`` is a property lookup, not free).
"""

from __future__ import annotations

from decimal import Decimal
from enum import StrEnum


class AuthorizationType(StrEnum):
    PURCHASE = "PURCHASE"  # debits the account
    REFUND = "REFUND"  # credits the account
    # The lifecycle (docs/lifecycle.md): a hold, a stand-in hold, a release of a hold (or a
    # credit back of a purchase), a posting that ends a hold.
    AUTHORIZATION = "AUTHORIZATION"
    ADVICE = "ADVICE"
    REVERSAL = "REVERSAL"
    CLEARING = "CLEARING"
    # An issuer's day (docs/lifecycle.md): a zero-amount check of the account, a zero-amount
    # question of its balances, an addition to an open hold.
    VERIFICATION = "VERIFICATION"
    BALANCE_INQUIRY = "BALANCE_INQUIRY"
    INCREMENTAL = "INCREMENTAL"


# Kinds that name an original (``original_transaction_id``): required, optional.
NAMES_ORIGINAL = frozenset({AuthorizationType.REVERSAL, AuthorizationType.CLEARING,
                            AuthorizationType.INCREMENTAL})
ORIGINAL_REQUIRED = frozenset({AuthorizationType.REVERSAL, AuthorizationType.INCREMENTAL})
# Kinds whose amount is exactly zero (every other kind's is above zero).
ZERO_AMOUNT = frozenset({AuthorizationType.VERIFICATION, AuthorizationType.BALANCE_INQUIRY})
# Kinds a merchant may let be approved in part (``partial_approval_supported``).
PARTIAL_APPROVAL = frozenset({AuthorizationType.PURCHASE, AuthorizationType.AUTHORIZATION})
# The kinds kept in lifecycle_messages (never purged), beside their dedup records.
LIFECYCLE_KINDS = frozenset({AuthorizationType.AUTHORIZATION, AuthorizationType.ADVICE,
                             AuthorizationType.REVERSAL, AuthorizationType.CLEARING,
                             AuthorizationType.INCREMENTAL})
# What the ledger's type may be: holds never write it.
LEDGER_TYPES = frozenset({AuthorizationType.PURCHASE, AuthorizationType.REFUND,
                          AuthorizationType.CLEARING, AuthorizationType.REVERSAL})


class HoldState(StrEnum):
    """A hold's life: ACTIVE, then exactly one end."""

    ACTIVE = "ACTIVE"
    REVERSED = "REVERSED"  # reversed to zero
    CLEARED = "CLEARED"
    EXPIRED = "EXPIRED"  # by `payauth holds expire`


class OrphanState(StrEnum):
    """A reversal (or a clearing) that came before its original."""

    WAITING = "WAITING"
    APPLIED = "APPLIED"  # to the hold (or the purchase) its original placed
    VOID = "VOID"  # the original was declined, or is of another account or currency


class Result(StrEnum):
    APPROVED = "APPROVED"
    DECLINED = "DECLINED"


# What payauth_decide answers for an approval of part of the amount (the available balance);
# stored and published as APPROVED, with the amount approved.
PARTIAL = "PARTIAL"


class DeclineReason(StrEnum):
    INSUFFICIENT_FUNDS = "INSUFFICIENT_FUNDS"
    UNKNOWN_ACCOUNT = "UNKNOWN_ACCOUNT"
    CURRENCY_MISMATCH = "CURRENCY_MISMATCH"
    ACCOUNT_BLOCKED = "ACCOUNT_BLOCKED"
    HOLD_NOT_ACTIVE = "HOLD_NOT_ACTIVE"  # an INCREMENTAL whose hold is unknown or ended
    # Card controls (docs/operations.md, "Card controls and spending limits").
    UNKNOWN_CARD = "UNKNOWN_CARD"  # no such card, or a card of another account
    CARD_BLOCKED = "CARD_BLOCKED"  # the card's status is not ACTIVE (the event names it)
    CARD_EXPIRED = "CARD_EXPIRED"  # expires_on before the message's own date
    CATEGORY_BLOCKED = "CATEGORY_BLOCKED"
    COUNTRY_BLOCKED = "COUNTRY_BLOCKED"
    LIMIT_EXCEEDED = "LIMIT_EXCEEDED"  # a spending limit (the event names it)


class CardStatus(StrEnum):
    """Only an ACTIVE card is used; any other status declines CARD_BLOCKED."""

    ACTIVE = "ACTIVE"
    FROZEN = "FROZEN"  # by the cardholder (the app's button), reversible
    LOST = "LOST"
    STOLEN = "STOLEN"
    CLOSED = "CLOSED"


class LimitScope(StrEnum):
    CARD = "CARD"
    ACCOUNT = "ACCOUNT"


class LimitPeriod(StrEnum):
    """Periods read from the message's own time in PAYAUTH_LIMITS_TIMEZONE."""

    TRANSACTION = "TRANSACTION"  # each message alone: counts nothing
    DAY = "DAY"
    WEEK = "WEEK"  # from Monday
    MONTH = "MONTH"


class BlockKind(StrEnum):
    CATEGORY = "CATEGORY"  # merchant_category, four digits
    COUNTRY = "COUNTRY"  # merchant_country, ISO 3166-1 alpha-2


class AccountStatus(StrEnum):
    """Only ACTIVE accounts are debited or credited; any other status declines."""

    ACTIVE = "ACTIVE"
    BLOCKED = "BLOCKED"
    CLOSED = "CLOSED"


class Outcome(StrEnum):
    """What happened to one message; the label of ``payauth_messages_total``."""

    APPROVED = "approved"
    DECLINED = "declined"
    DUPLICATE = "duplicate"
    CONFLICT = "conflict"
    INVALID = "invalid"


class DuplicateLayer(StrEnum):
    """Which layer recognised a duplicate (``payauth_duplicates_total{layer}``)."""

    REDIS = "redis"
    POSTGRES = "postgres"


class DuplicateCause(StrEnum):
    """Why a duplicate came (``payauth_duplicates_total{cause}``), and whom to call."""

    REDELIVERY = "redelivery"  # the same message again (a rebalance, a crash before commit)
    PRODUCER_RETRY = "producer_retry"  # same transaction, new message_id: the gateway retried
    CROSS_PARTITION = "cross_partition"  # first decided from another partition: keying upstream
    REPLAY = "replay"  # re-read after an operator's `payauth replay --execute`
    REDRIVE = "redrive"  # re-sent by `payauth dlq redrive`


# Amounts are stored as numeric with at most 15 integer digits in the ledger (and at most
# 4 decimals). Bounding here (for credits as much as debits) keeps Decimal("1e400"), which
# *is* finite, out of the database instead of turning it into a numeric overflow that would
# never stop retrying.
MAX_AMOUNT = Decimal("999999999999999")
MAX_AMOUNT_DECIMALS = 4
# The largest REFUND decided without a person looking (PAYAUTH_MAX_REFUND_AMOUNT's default).
DEFAULT_MAX_REFUND = Decimal("10000")

# Identifiers (transaction, account, message ids): printable ASCII without spaces, so that
# they are safe in logs, headers and keys; at most 64 of them.
IDENTIFIER_CHARS = "[!-~]"
IDENTIFIER_MAX_LENGTH = 64
IDENTIFIER_PATTERN = f"^{IDENTIFIER_CHARS}{{1,{IDENTIFIER_MAX_LENGTH}}}$"  # as the schema says
CURRENCY_PATTERN = r"^[A-Z]{3}$"
COUNTRY_PATTERN = r"^[A-Z]{2}$"  # ISO 3166-1 alpha-2, as the networks send it
