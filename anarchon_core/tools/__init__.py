"""Tooling, not library: ``anarchon demo`` and the instance processes it (and the tests) start."""
