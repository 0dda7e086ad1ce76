"""How long an election is leaderless after its leader is SIGKILLed, on every backend.

    python -m bench.elections                       # every backend, 5 failovers each
    python -m bench.elections --backends etcd --quick

Three candidate processes campaign; once one leads (and has renewed at least
once), it is SIGKILLed and the time until another leads is measured. A leader
that renewed just before it died holds for up to its whole TTL, so the
physical bound is the TTL plus the backend's declared slack plus one round
trip. On etcd, etcd's own election API (`/v3/election/campaign` on a lease
of the same TTL, kept alive by the candidate) is measured the same way, as the
anchor.
"""

from __future__ import annotations

import argparse
import base64
import json
import multiprocessing as mp
import os
import signal
import statistics
import sys
import threading
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from bench.backends import BACKENDS, publish, throwaway

TTL = 2.0


def corral_candidate(url: str, name: str, identity: str, out: Any) -> None:
    import corral

    store = corral.connect(url)
    election = store.election(name, ttl=TTL, identity=identity)
    assert election.campaign(wait=None)
    out.put((identity, time.monotonic()))
    time.sleep(3600)


def _post(base: str, path: str, body: dict[str, Any], timeout: float = 3600) -> dict[str, Any]:
    request = urllib.request.Request(
        base + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout) as reply:
        answer: dict[str, Any] = json.loads(reply.read() or b"{}")
        return answer


def etcd_candidate(url: str, name: str, identity: str, out: Any) -> None:
    """etcd's own recipe: a lease kept alive every TTL/3, and a blocking campaign on it."""
    host = url.split("://", 1)[1].split(",")[0].split("/")[0]
    base = f"http://{host}"
    lease = _post(base, "/v3/lease/grant", {"TTL": int(TTL)})["ID"]

    def keep_alive() -> None:
        while True:
            _post(base, "/v3/lease/keepalive", {"ID": lease}, timeout=5)
            time.sleep(TTL / 3)

    threading.Thread(target=keep_alive, daemon=True).start()
    _post(
        base,
        "/v3/election/campaign",
        {
            "name": base64.b64encode(name.encode()).decode(),
            "lease": lease,
            "value": base64.b64encode(identity.encode()).decode(),
        },
    )
    out.put((identity, time.monotonic()))
    time.sleep(3600)


def failover(candidate: Any, url: str) -> float:
    """Seconds from SIGKILL of the leader to the next leader's election."""
    name = f"bench-{uuid.uuid4().hex}"
    queue: mp.Queue[tuple[str, float]] = mp.Queue()
    procs = {
        identity: mp.Process(target=candidate, args=(url, name, identity, queue), daemon=True)
        for identity in ("a", "b", "c")
    }
    for proc in procs.values():
        proc.start()
    try:
        leader, _ = queue.get(timeout=60)
        time.sleep(TTL / 3 + 0.3)  # let the leader renew at least once
        killed_at = time.monotonic()
        pid = procs[leader].pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        successor, elected_at = queue.get(timeout=60)
        assert successor != leader
        return elected_at - killed_at
    finally:
        for proc in procs.values():
            if proc.is_alive() and proc.pid is not None:
                os.kill(proc.pid, signal.SIGKILL)
            proc.join()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--quick", action="store_true", help="a smoke run, not for numbers")
    parser.add_argument("--output", type=Path, help="also write the markdown table here")
    args = parser.parse_args()
    chosen = [b.strip() for b in args.backends.split(",") if b.strip()]
    runs = 2 if args.quick else 5

    import corral

    lines = [
        f"### Election failover after SIGKILL of the leader (ttl={TTL:g} s, median of {runs})",
        "",
        "| backend | implementation | failover median s | max s | bound: ttl + slack s |",
        "|---|---|---:|---:|---:|",
    ]
    for backend in chosen:
        with throwaway(backend) as url:
            with corral.connect(url) as store:
                slack = store.capabilities.ttl_slack
            kinds = [("corral", corral_candidate)]
            if backend == "etcd":
                kinds.append(("etcd election API (anchor)", etcd_candidate))
            for label, candidate in kinds:
                times = []
                for run in range(runs):
                    times.append(failover(candidate, url))
                    print(
                        f"  {backend} {label}: failover {run + 1}/{runs} {times[-1]:.2f} s",
                        file=sys.stderr,
                        flush=True,
                    )
                lines.append(
                    f"| {backend} | {label} | {statistics.median(times):.2f} | {max(times):.2f} "
                    f"| {TTL + slack:.1f} |"
                )
    publish(lines, args.output)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
