"""Benchmarks: `python -m benchmarks NAME [options]` prints a table and writes JSON (never run by pytest)."""
