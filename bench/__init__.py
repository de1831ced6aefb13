"""Benchmarks of rocm-isolation-webhook: ``make bench`` (``python -m bench.run``) writes docs/benchmarks.md."""
