"""Kafka with confluent-kafka, one concern per module: ``config`` (client settings),
``consumer`` (the consume loop and its offsets, on a thread of its own), ``publisher``
(produce and await acknowledgements from asyncio), ``admin`` (what the tools ask the cluster).
"""
