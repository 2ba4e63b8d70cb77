"""Fixtures shared by every tier. Integration and e2e tests need the local stack."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support import stack
from tests.support.workers import WorkerProcess


@pytest.fixture(scope="session")
def live_stack() -> Iterator[None]:
    stack.require_stack()
    asyncio.run(stack.ensure_template())
    yield
    asyncio.run(stack.drop_template())


@pytest.fixture
def env(live_stack: None, request: pytest.FixtureRequest) -> Iterator[stack.Env]:
    """A fresh database (migrated), fresh topics and a fresh consumer group for one test."""
    marker = request.node.get_closest_marker("partitions")
    partitions = marker.args[0] if marker else 4
    suffix = uuid.uuid4().hex[:8]
    world = stack.Env(
        database=asyncio.run(stack.create_database()),
        input_topic=f"t.{suffix}.in",
        output_topic=f"t.{suffix}.out",
        dlq_topic=f"t.{suffix}.dlq",
        group_id=f"g-{suffix}",
        partitions=partitions,
        redis_url=f"{stack.REDIS_URL.rsplit('/', 1)[0]}/0",
    )
    stack.create_topics({world.input_topic: partitions, world.output_topic: partitions,
                         world.dlq_topic: 1})
    yield world
    stack.delete_topics([world.input_topic, world.output_topic, world.dlq_topic])
    asyncio.run(stack.drop_database(world.database))


@pytest.fixture
def spawn_worker(tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    """Start real ``payauth run`` processes; any left running are killed at the end."""
    started: list[WorkerProcess] = []

    def spawn(world: stack.Env, name: str = "w", **overrides: str) -> WorkerProcess:
        worker = WorkerProcess(world.worker_env(**overrides),
                               tmp_path / f"{name}-{len(started)}.log")
        started.append(worker.start())
        return worker

    yield spawn
    for worker in started:
        worker.kill()
