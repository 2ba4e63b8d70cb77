"""``make bench``: the benchmark report (see ``service.bench.run``)."""
