"""The partition faults' nftables rules (service/devtools/chaos/netsplit.py): what each kind
drops, read off the script that puts it in place. (The HA smoke applies them to the
namespaces of the replicated stack.)"""

from __future__ import annotations

import pytest

from service.devtools.chaos.netsplit import Split, ruleset


def _chains(script: str) -> dict[str, list[str]]:
    body = script.split("table inet payauth_fault {", 1)[1]
    chains: dict[str, list[str]] = {}
    current = ""
    for line in body.splitlines():
        line = line.strip()
        if line.startswith("chain "):
            current = line.split()[1]
            chains[current] = []
        elif line.endswith("drop"):
            chains[current].append(line)
    return chains


def test_a_full_partition_drops_both_ways_to_the_peers_only() -> None:
    chains = _chains(ruleset(Split("payauth-pg1", ("10.0.0.10", "10.0.0.12"))))
    assert chains == {"input": ["ip saddr { 10.0.0.10, 10.0.0.12 } drop"],
                      "output": ["ip daddr { 10.0.0.10, 10.0.0.12 } drop"]}


@pytest.mark.parametrize(("direction", "dropping"), [("out", ["output"]), ("in", ["input"])])
def test_one_direction_drops_only_that_direction(direction: str, dropping: list[str]) -> None:
    chains = _chains(ruleset(Split("payauth-k1", ("10.0.0.22",), direction)))  # type: ignore[arg-type]
    assert [name for name, rules in chains.items() if rules] == dropping


def test_a_lossy_link_drops_a_share_at_random() -> None:
    chains = _chains(ruleset(Split("payauth-k2", ("10.0.0.21",), loss_percent=30)))
    assert chains["input"] == ["ip saddr { 10.0.0.21 } numgen random mod 100 < 30 drop"]


def test_a_new_fault_replaces_the_one_before_in_one_transaction() -> None:
    script = ruleset(Split("payauth-r1", ("10.0.0.41",)))
    lines = script.splitlines()
    assert lines[:2] == ["table inet payauth_fault", "delete table inet payauth_fault"]


@pytest.mark.parametrize("bad", [{"peers": ()}, {"peers": ("10.0.0.1",), "loss_percent": 0},
                                 {"peers": ("10.0.0.1",), "loss_percent": 101}])
def test_a_split_that_cuts_nothing_is_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        Split("payauth-s1", **bad)  # type: ignore[arg-type]
