"""What a backend promises, declared once and used three ways.

The lock logic reads the flags (may it wait for a pushed wake-up, or must it
poll?), the test-suite selects tests by them, and the guarantees table in
docs/locks.md is generated from them, so the documentation cannot drift from
what the code declares.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Capabilities"]


@dataclass(frozen=True, slots=True)
class Capabilities:
    """A backend's declared characteristics and its honest failure behaviour."""

    scheme: str
    """The URL scheme that selects the backend."""
    notifies: bool
    """Waiters are woken by the release itself (else they poll with backoff)."""
    cross_process: bool
    """Processes that open the same URL share locks."""
    cross_host: bool
    """Processes on different machines share locks."""
    linearizable: bool
    """Every acquisition is agreed by a quorum or a single serialising server."""
    fair: bool
    """`fair=True` (arrival order) is supported."""
    replicas: bool
    """`replicas=N` (wait for N replicas to have the acquisition) is supported."""
    ttl_clock: str
    """Whose clock enforces the TTL."""
    on_client_crash: str
    on_server_restart: str
    on_partition: str
    on_memory_pressure: str
    ttl_slack: float = 0.0
    """How much longer than its TTL an unrenewed lock may stay held (servers that count
    whole seconds round up, so a lock never ends early)."""
    fencing_tokens: str = ""
    """Where the fencing tokens come from, and what (if anything) could break their order."""
    state_per_name: str = ""
    """What stays on the server for a lock name once it is released and expired."""
    semaphores: str = ""
    """How a semaphore's slots are kept, in one phrase; empty where `store.semaphore()`
    is not available (yet) on this backend."""
    cache: str = ""
    """How cache entries are kept and read, in one phrase; empty where `store.cache()`
    is not available (yet) on this backend."""
