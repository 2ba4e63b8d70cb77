"""Waiting out PostgreSQL's absence: the backoff spaces a batch's retries while the store is
away, and the batch resumes as soon as it answers again (a failover's few seconds), not
when the longest backoff ends (``pipeline.BatchProcessor``)."""

from __future__ import annotations

import asyncio

import structlog

from service.core.ports import Store

log = structlog.get_logger(__name__)

# How often a batch waiting out PostgreSQL's absence asks whether it is back, at most.
PROBE_INTERVAL_S = 0.1


async def until_store_answers(store: Store, delay: float, *, probe_every: float) -> None:
    """Wait ``delay``, or until ``store`` answers again after it was seen away, asking every
    ``probe_every`` seconds (at most every ``PROBE_INTERVAL_S``). A store that answers its
    first question although the batch failed (a read-only node still in the pool) is waited
    out whole: retried at once, the batch would fail at once."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    deadline = started + delay
    interval = min(probe_every, PROBE_INTERVAL_S)
    seen_away = False
    while (remaining := deadline - loop.time()) > 0:
        await asyncio.sleep(min(interval, remaining))
        if loop.time() >= deadline:
            return
        try:
            answers = await asyncio.wait_for(store.ping(), max(deadline - loop.time(), 0.001))
        except TimeoutError:
            return
        if answers and seen_away:
            log.info("postgres_answers_again", waited_s=round(loop.time() - started, 3),
                     backoff_s=round(delay, 3))
            return
        if answers:
            await asyncio.sleep(max(deadline - loop.time(), 0))
            return
        seen_away = True
