"""What a shadow replay found, and how it is shown: pure values, no I/O.

Every transaction of the range lands in one group: its stored decision unchanged, changed
(old → new), not decidable again (decided before inputs were recorded), given no answer by
the rule now (a broken rule: a replay would stop its partition), decided by a real replay
now (never decided but valid), or decided with its dedup record purged (its effect kept in
the ledger or the lifecycle records, or a decline's event on the output topic). Messages a
replay would dead-letter again (invalid, a conflict with a decided transaction, a lifecycle
mismatch, over a limit) are counted per message, by reason.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Shown per group on screen; the JSON report lists every transaction of a changed group.
EXAMPLES_ON_SCREEN = 5


@dataclass(frozen=True, order=True)
class Decision:
    result: str
    decline_reason: str | None = None
    partial: str | None = None  # a partial approval: what it approved (account currency)

    @classmethod
    def of(cls, outcome: str, partial: str | None = None) -> Decision:
        """From payauth_decide's answer: 'APPROVED', 'PARTIAL' (with what payauth_approved
        approves) or a decline reason."""
        if outcome == "APPROVED":
            return cls("APPROVED")
        if outcome == "PARTIAL":
            return cls("APPROVED", None, partial)
        return cls("DECLINED", outcome)

    def __str__(self) -> str:
        if self.partial is not None:
            return f"{self.result} (partially: {self.partial})"
        return f"{self.result} ({self.decline_reason})" if self.decline_reason else self.result

    def as_json(self) -> dict[str, str | None]:
        out = {"result": self.result, "decline_reason": self.decline_reason}
        if self.partial is not None:
            out["amount_approved"] = self.partial
        return out


@dataclass
class ShadowReport:
    """Filled transaction by transaction; each transaction counts once, in its first group."""

    source: str  # what was read: the topic and ranges, or "N transaction ids"
    rule_now: str
    messages: int = 0
    unchanged: int = 0
    changed: dict[tuple[Decision, Decision], list[str]] = field(default_factory=dict)
    not_recorded: list[str] = field(default_factory=list)
    rule_versions: Counter[str] = field(default_factory=Counter)  # of the decided ones
    dead_lettered_again: Counter[str] = field(default_factory=Counter)  # reason → messages
    would_decide: dict[Decision, list[str]] = field(default_factory=dict)
    ledger_only: list[str] = field(default_factory=list)  # effect kept: ledger or lifecycle
    event_only: list[str] = field(default_factory=list)  # a purged decline: its event kept
    no_answer: list[str] = field(default_factory=list)  # the rule now returns nothing
    unknown: list[str] = field(default_factory=list)  # ids asked for, never decided
    _seen: set[str] = field(default_factory=set, repr=False)
    # Of the transactions never decided: a later message with another payload is a conflict.
    undecided_fingerprints: dict[str, str] = field(default_factory=dict, repr=False)
    # Found in no table: what the rule decides now, until the output topic says whether a
    # decision was published for it (``settle_pending``).
    pending: dict[str, Decision] = field(default_factory=dict, repr=False)

    def settle_pending(self, published: set[str]) -> None:
        """The pending transactions with a decision's event: decided, their record purged;
        the others: a replay would decide them."""
        for txn, decision in self.pending.items():
            if txn in published:
                self.event_only.append(txn)
            else:
                self.would_decide.setdefault(decision, []).append(txn)
        self.pending = {}

    def first_time(self, transaction_id: str) -> bool:
        """True once per transaction: a transaction sent twice is compared once."""
        if transaction_id in self._seen:
            return False
        self._seen.add(transaction_id)
        return True

    def add_decided(self, transaction_id: str, stored: Decision, now: Decision | None,
                    rule_version: str | None) -> None:
        """``now``/``rule_version`` None: decided before the inputs were recorded."""
        if now is None or rule_version is None:
            self.not_recorded.append(transaction_id)
            return
        self.rule_versions[rule_version] += 1
        if now == stored:
            self.unchanged += 1
        else:
            self.changed.setdefault((stored, now), []).append(transaction_id)

    @property
    def decided(self) -> int:
        return (self.unchanged + sum(map(len, self.changed.values())) + len(self.not_recorded)
                + len(self.no_answer) + len(self.ledger_only) + len(self.event_only))

    @property
    def changed_count(self) -> int:
        return sum(map(len, self.changed.values()))

    @property
    def would_change(self) -> bool:
        """A stored decision the rule now decides otherwise (or not at all), or a message a
        real replay would decide: the exit status 3."""
        return bool(self.changed or self.would_decide or self.no_answer)

    def render(self) -> str:
        versions = ", ".join(f"{v} ({n})" for v, n in self.rule_versions.most_common())
        lines = [
            "shadow replay (nothing is written)",
            f"read: {self.source}",
            f"rule now: {self.rule_now}; decided under: {versions or 'none recorded'}",
            f"messages read: {self.messages}",
            "",
            f"{'decided transactions':<46}{self.decided:>8}",
            f"{'  unchanged':<46}{self.unchanged:>8}",
            f"{'  changed':<46}{self.changed_count:>8}",
        ]
        for (old, new), ids in sorted(self.changed.items()):
            lines.append(f"    {str(old) + ' -> ' + str(new):<42}{len(ids):>8}  {_examples(ids)}")
        lines.append(f"{'  inputs not recorded (decided before them)':<46}"
                     f"{len(self.not_recorded):>8}  {_examples(self.not_recorded)}".rstrip())
        if self.no_answer:
            lines.append(f"{'  no answer from the rule now (it is broken)':<46}"
                         f"{len(self.no_answer):>8}  {_examples(self.no_answer)}")
        if self.ledger_only:
            lines.append(f"{'  dedup record purged, its effect kept':<46}"
                         f"{len(self.ledger_only):>8}  {_examples(self.ledger_only)}")
        if self.event_only:
            lines.append(f"{'  dedup record purged, its event kept':<46}"
                         f"{len(self.event_only):>8}  {_examples(self.event_only)}")
        lines.append(f"{'never decided: a replay would decide':<46}"
                     f"{sum(map(len, self.would_decide.values())):>8}")
        for decision, ids in sorted(self.would_decide.items()):
            lines.append(f"    {'decide now: ' + str(decision):<42}{len(ids):>8}  "
                         f"{_examples(ids)}")
        lines.append(f"{'messages a replay would dead-letter again':<46}"
                     f"{sum(self.dead_lettered_again.values()):>8}")
        for reason, count in sorted(self.dead_lettered_again.items()):
            lines.append(f"    {reason:<42}{count:>8}")
        if self.unknown:
            lines.append(f"{'transaction ids never decided (or purged)':<46}"
                         f"{len(self.unknown):>8}  {_examples(self.unknown)}")
        lines.append("")
        lines.append(self._verdict())
        return "\n".join(lines)

    def _verdict(self) -> str:
        if not self.would_change:
            return "nothing would change"
        parts = []
        if self.no_answer:
            parts.append(f"The rule now gives no answer for {len(self.no_answer)} decided "
                         "transaction(s): it is broken, and a replay would stop their "
                         "partitions.")
        if self.changed:
            parts.append(f"{self.changed_count} stored decision(s) differ from what the rule "
                         "decides now.\nA replay keeps stored results: each needs a person "
                         "(reverse, re-authorize, tell the customer).")
        if self.would_decide:
            parts.append(f"A replay would decide {sum(map(len, self.would_decide.values()))} "
                         "message(s) never decided\n(decide now: each alone against its "
                         "account as it is now).")
        return "\n".join(parts)

    def as_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "rule_version_now": self.rule_now,
            "decided_under": dict(self.rule_versions),
            "messages_read": self.messages,
            "decided": self.decided,
            "unchanged": self.unchanged,
            "changed": [{"from": old.as_json(), "to": new.as_json(), "count": len(ids),
                         "transaction_ids": ids}
                        for (old, new), ids in sorted(self.changed.items())],
            "inputs_not_recorded": {"count": len(self.not_recorded),
                                    "transaction_ids": self.not_recorded},
            "no_answer": {"count": len(self.no_answer), "transaction_ids": self.no_answer},
            "ledger_only": {"count": len(self.ledger_only),
                            "transaction_ids": self.ledger_only},
            "event_only": {"count": len(self.event_only), "transaction_ids": self.event_only},
            "never_decided": {
                "dead_letter_again": dict(sorted(self.dead_lettered_again.items())),
                "decide_now": [{**d.as_json(), "count": len(ids), "transaction_ids": ids}
                               for d, ids in sorted(self.would_decide.items())],
            },
            "unknown_transaction_ids": self.unknown,
            "would_change": self.would_change,
        }

    def write_json(self, path: Path) -> None:
        path.write_text(json.dumps(self.as_json(), indent=2) + "\n")


def _examples(ids: list[str]) -> str:
    if not ids:
        return ""
    shown = ", ".join(ids[:EXAMPLES_ON_SCREEN])
    return f"e.g. {shown}" + (", …" if len(ids) > EXAMPLES_ON_SCREEN else "")
