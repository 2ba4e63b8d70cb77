"""``make bench``: the benchmark report (see ``service.devtools.bench.run``)."""
