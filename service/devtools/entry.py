"""The worker as the tests and the chaos run start it: the production composition root
(``service.worker.run_worker``) with the fault-injecting adapters of ``faults`` wired in,
as the environment asks (``PAYAUTH_TEST_FAULT_POINT``, ``PAYAUTH_TEST_UNSAFE_ORDERING``)."""

from __future__ import annotations

import asyncio
import os
import sys

from service.config import Settings
from service.core.ports import Cache, Publisher, Store
from service.devtools.faults import (
    POINTS,
    FaultyCache,
    FaultyPublisher,
    FaultyStore,
    KilledInTransactionStore,
    LostReplyOnceStore,
    RollbackOnceStore,
)
from service.worker import Wiring, run_worker


def faulty_wiring(point: str, unsafe_ordering: str) -> Wiring:
    def store(inner: Store, cache: Cache) -> Store:
        return FaultyStore(inner, cache, point, unsafe_ordering)

    def cache(inner: Cache) -> Cache:
        return FaultyCache(inner, point)

    def publisher(inner: Publisher) -> Publisher:
        return FaultyPublisher(inner, point)

    return Wiring(
        store_class={"rollback_once": RollbackOnceStore,
                     "connection_lost_after_commit": LostReplyOnceStore,
                     "inside_db_transaction": KilledInTransactionStore}.get(
                         point, Wiring.store_class),
        wrap_store=store, wrap_cache=cache, wrap_publisher=publisher,
    )


def run_faulty_worker(settings: Settings) -> int:
    point = os.environ.get("PAYAUTH_TEST_FAULT_POINT", "")
    unsafe = os.environ.get("PAYAUTH_TEST_UNSAFE_ORDERING", "")
    if point not in ("", *POINTS) or unsafe not in ("", "redis_before_commit"):
        print(f"payauth-dev: PAYAUTH_TEST_FAULT_POINT must be one of {', '.join(POINTS)}; "
              "PAYAUTH_TEST_UNSAFE_ORDERING may only be redis_before_commit", file=sys.stderr)
        return 2
    return asyncio.run(run_worker(settings, faulty_wiring(point, unsafe)))
