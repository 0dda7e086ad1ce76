"""Backends: each a thin set of atomic primitives with declared capabilities."""
