"""Proof under faults: a load generator that keeps a ground-truth log, a checker that holds
the database, the topics and Redis against it, and the chaos run that injects faults
in between (``make chaos``)."""
