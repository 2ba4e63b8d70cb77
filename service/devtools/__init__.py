"""Tools for the people who develop and prove payauth, not for the worker's runtime: the demo,
the benchmark, the chaos run and its checker, scratch databases, process supervision, and the
fault-injecting adapters. The image does not ship this package, and nothing under
``service/`` outside it imports it (a test reads the imports)."""
