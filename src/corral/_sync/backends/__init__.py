# Generated from src/corral/_async/backends/__init__.py by scripts/unasync.py: do not edit.
# Edit the asyncio flavour and run `python scripts/unasync.py`.
"""Backends: each a thin set of atomic primitives with declared capabilities."""
