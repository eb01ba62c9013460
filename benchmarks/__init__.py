"""Benchmarks of sparkctl on the simulated lab: `make bench` / `python -m benchmarks.run`."""
