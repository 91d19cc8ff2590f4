"""Benchmarks of the engine on real stores (see docs/benchmarks.md)."""
