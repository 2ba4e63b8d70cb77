"""Network faults between the replicated stack's nodes, each node in a network namespace of
its own (deploy/local/ha_net.sh): a node cut from some of its peers while it still reaches
the others (the workers among them), in both directions or in one, or a link that loses a
share of its packets. The faults that split a cluster, which killing a process cannot make.

A fault is an nftables table (``payauth_fault``) inside the cut node's namespace, dropping
what it receives from the peers, what it sends them, or both; packets are dropped, not
refused, so that each side's timeouts decide, as on a real network. ``heal`` deletes the
table; ``ha.sh down`` deletes the namespaces and whatever they hold. Nothing outside the
stack's own namespaces is ever touched.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from typing import Literal

TABLE = "payauth_fault"

Direction = Literal["both", "out", "in"]


@dataclass(frozen=True)
class Split:
    """``namespace``'s node cut from ``peers`` (addresses): ``out`` loses what it sends them,
    ``in`` what they send it, ``both`` all of it; ``loss_percent`` below 100 drops that
    share of those packets at random (a lossy link) instead of every one."""
    namespace: str
    peers: tuple[str, ...]
    direction: Direction = "both"
    loss_percent: int = 100

    def __post_init__(self) -> None:
        if not self.peers:
            raise ValueError("a split needs at least one peer")
        if not 0 < self.loss_percent <= 100:
            raise ValueError(f"loss_percent {self.loss_percent}: 1-100")


def ruleset(split: Split) -> str:
    """The nft script that puts ``split`` in place, replacing any fault the namespace held
    (one table, made empty and filled in one transaction)."""
    peers = "{ " + ", ".join(split.peers) + " }"
    drop = "drop" if split.loss_percent == 100 else (
        f"numgen random mod 100 < {split.loss_percent} drop")
    rules_in = [f"    ip saddr {peers} {drop}"] if split.direction in ("both", "in") else []
    rules_out = [f"    ip daddr {peers} {drop}"] if split.direction in ("both", "out") else []
    return "\n".join([
        f"table inet {TABLE}",  # (declared first, so that the delete never fails)
        f"delete table inet {TABLE}",
        f"table inet {TABLE} {{",
        "  chain input {",
        "    type filter hook input priority -10; policy accept;",
        *rules_in,
        "  }",
        "  chain output {",
        "    type filter hook output priority -10; policy accept;",
        *rules_out,
        "  }",
        "}",
        "",
    ])


def cut(split: Split) -> None:
    subprocess.run(["ip", "netns", "exec", split.namespace, "nft", "-f", "-"],
                   input=ruleset(split), text=True, check=True, capture_output=True)


def heal(namespace: str) -> None:
    """Whatever fault ``namespace`` holds removed (none: nothing to do)."""
    subprocess.run(["ip", "netns", "exec", namespace, "nft", "-f", "-"],
                   input=f"table inet {TABLE}\ndelete table inet {TABLE}\n", text=True,
                   check=True, capture_output=True)


def faults(namespace: str) -> str:
    """The fault rules ``namespace`` holds now, as nft lists them ('' for none)."""
    listed = subprocess.run(["ip", "netns", "exec", namespace, "nft", "list", "table", "inet",
                             TABLE], text=True, capture_output=True)
    return listed.stdout if listed.returncode == 0 else ""
