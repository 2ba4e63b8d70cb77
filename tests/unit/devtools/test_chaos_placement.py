"""Offsets for the load generator's messages the broker acknowledged without one (an
idempotent producer's retry of a batch already written): found by their bytes."""

from __future__ import annotations

from service.devtools.chaos.placement import assign


def line(seq: int) -> dict[str, object]:
    return {"seq": seq, "kind": "new_purchase", "txn": f"T{seq}", "partition": 7,
            "offset": None}


def test_a_message_takes_the_offset_its_bytes_sit_at() -> None:
    placed, missing = assign([(line(1), b"a"), (line(2), b"b")],
                             {b"a": [10], b"b": [12]}, logged={11})
    assert [(p["seq"], p["offset"]) for p in placed] == [(1, 10), (2, 12)]
    assert missing == []


def test_copies_of_the_same_bytes_take_the_offsets_no_logged_copy_has_in_send_order() -> None:
    # the same message sent three times (a duplicate of the very same bytes): offset 20 is
    # the copy the log already names; the two unplaced copies take 21 and 25, the earlier
    # sent the lower offset
    placed, missing = assign([(line(9), b"dup"), (line(4), b"dup")],
                             {b"dup": [25, 20, 21]}, logged={20})
    assert sorted((p["seq"], p["offset"]) for p in placed) == [(4, 21), (9, 25)]
    assert missing == []


def test_a_message_not_in_its_partition_is_reported_missing() -> None:
    placed, missing = assign([(line(1), b"a"), (line(2), b"a")], {b"a": [3]}, logged=set())
    assert [(p["seq"], p["offset"]) for p in placed] == [(1, 3)]
    assert [m["seq"] for m in missing] == [2]
    assert assign([(line(5), b"gone")], {}, logged=set()) == ([], [line(5)])
