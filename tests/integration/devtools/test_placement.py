"""The load generator's messages acknowledged without an offset, found in their partition
on the real broker by their bytes (placement.py): a copy of the very same bytes takes the
offset no logged copy names; a message not in its partition is reported, never guessed."""

from __future__ import annotations

import json
from pathlib import Path

from service.devtools.chaos.placement import place
from tests.support import stack


def unplaced(seq: int) -> dict[str, object]:
    return {"seq": seq, "kind": "dup_same_message", "txn": f"T{seq}", "partition": 0,
            "offset": None}


def test_unplaced_messages_take_their_offsets_in_the_partition(env: stack.Env,
                                                               tmp_path: Path) -> None:
    stack.produce(env.input_topic, [(b"k", b"first"), (b"k", b"dup"), (b"k", b"dup"),
                                    (b"k", b"last")], partition=0)
    # the log names offset 1 for the first copy of b"dup"; the second copy came back
    # without an offset, and so did a message that is not in the partition at all
    log = tmp_path / "truth.jsonl"
    log.write_text("".join(json.dumps({"seq": seq, "partition": 0, "offset": offset}) + "\n"
                           for seq, offset in ((1, 0), (2, 1), (4, 3))))
    placed, missing = place(stack.kafka_conf(), env.input_topic,
                            [(unplaced(3), b"dup"), (unplaced(5), b"never written")], log)
    assert [(line["seq"], line["offset"]) for line in placed] == [(3, 2)]
    assert [line["seq"] for line in missing] == [5]
