"""The operator commands behind ``payauth``: migrate, verify, topics, replay (and its shadow),
dlq redrive, purge, explain, accounts load. Each runs once and exits; unlike the worker,
they talk to asyncpg and confluent-kafka directly (see ARCHITECTURE.md, "Which way the
imports point")."""
