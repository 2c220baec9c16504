"""Benchmarks: speed and quality, apart from the tests, writing machine-readable results."""
