"""The asyncio flavour of corral, hand-written; `corral._sync` is generated from it."""
