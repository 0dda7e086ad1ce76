"""The blocking flavour of corral, generated from `corral._async` (see scripts/unasync.py)."""
