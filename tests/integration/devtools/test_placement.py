"""The load generator's messages acknowledged without an offset, found in their partition
on the real broker by their bytes (placement.py): a copy of the very same bytes takes the
offset no logged copy names; a message not in its partition is reported, never guessed."""

from __future__ import annotations

from service.devtools.chaos.placement import place
from tests.support import stack


def unplaced(seq: int) -> dict[str, object]:
    return {"seq": seq, "kind": "dup_same_message", "txn": f"T{seq}", "partition": 0,
            "offset": None}


def test_unplaced_messages_take_their_offsets_in_the_partition(env: stack.Env) -> None:
    stack.produce(env.input_topic, [(b"k", b"first"), (b"k", b"dup"), (b"k", b"dup"),
                                    (b"k", b"last")], partition=0)
    # the log names offset 1 for the first copy of b"dup"; the second copy came back
    # without an offset, and so did a message that is not in the partition at all
    placed, missing = place(stack.kafka_conf(), env.input_topic,
                            [(unplaced(3), b"dup"), (unplaced(5), b"never written")],
                            logged={0: {0, 1, 3}})
    assert [(line["seq"], line["offset"]) for line in placed] == [(3, 2)]
    assert [line["seq"] for line in missing] == [5]
