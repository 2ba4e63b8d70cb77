"""Adapters: Kafka, PostgreSQL, Redis. They translate library errors into service errors."""
