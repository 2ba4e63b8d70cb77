"""The values a batch builds for every message have slots, no instance dict: the worker's CPU
per authorization depends on it (docs/benchmark.md, "Design figures"), and a
``cached_property`` cannot live on them."""

from __future__ import annotations

import pytest

from service.core.plan import Conflict, Decided, Duplicate, Invalid
from service.core.ports import Record
from service.domain.dedup import Classified, StoredResult
from service.domain.messages import Authorization


@pytest.mark.parametrize("cls", [Authorization, StoredResult, Classified, Decided, Duplicate,
                                 Conflict, Invalid, Record])
def test_a_per_message_value_has_no_instance_dict(cls: type) -> None:
    assert "__slots__" in vars(cls)
    assert cls.__dictoffset__ == 0  # type: ignore[attr-defined]  # no __dict__, from any base


def test_the_check_can_fail() -> None:
    class Plain:
        pass

    assert Plain.__dictoffset__ != 0  # type: ignore[attr-defined]
