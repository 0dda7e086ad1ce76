"""Several processes race for one lock with `corral run`, on the embedded SQLite store.

    python examples/race.py

No server is needed: with no --url and no CORRAL_URL, corral uses an SQLite
file in your cache directory, shared by every process on this machine.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid

import corral

CORRAL = [sys.executable, "-m", "corral"]
# What each "report" does: say who it is and which fencing token it was given.
REPORT = (
    "import os, time; "
    'print(f\'  worker {os.environ["WORKER"]}: generating the report with fencing token '
    '{os.environ["CORRAL_LOCK_TOKEN"]}\', flush=True); '
    "time.sleep(float(os.environ['HOLD']))"
)


def run(name: str, worker: int, *options: str, hold: float = 1.0) -> subprocess.Popen[str]:
    env = {**os.environ, "WORKER": str(worker), "HOLD": str(hold)}
    return subprocess.Popen(
        [*CORRAL, "run", name, *options, "--", sys.executable, "-c", REPORT],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def heading(text: str) -> None:
    print(f"\n\033[1m{text}\033[0m")


def main() -> None:
    store = corral.connect()
    print(f"store: {store.server}")
    name = f"nightly-report-{uuid.uuid4().hex[:6]}"

    heading(f"1. Five cron jobs start `corral run {name} --wait 0` at the same moment")
    procs = [run(name, worker, "--ttl", "10", "--wait", "0", hold=1.5) for worker in range(1, 6)]
    outcomes = []
    for worker, proc in enumerate(procs, 1):
        out, err = proc.communicate()
        outcomes.append((worker, out, err, proc.returncode))
    for worker, out, err, status in outcomes:
        if status == 0:
            print(out.rstrip())
            print(f"  worker {worker}: exit 0 (the winner)")
        else:
            print(f"  worker {worker}: exit {status}: {err.strip()}")
    winners = sum(1 for *_, status in outcomes if status == 0)
    print(f"  -> {winners} winner, {5 - winners} turned away with exit 75 (EX_TEMPFAIL)")

    heading("2. Five queue consumers wait their turn (--wait 30), each holding the lock 0.3 s")
    procs = [run(name, worker, "--ttl", "10", "--wait", "30", hold=0.3) for worker in range(1, 6)]
    lines = []
    for proc in procs:
        out, err = proc.communicate()
        assert proc.returncode == 0, err
        lines.append(out.rstrip())
    lines.sort(key=lambda line: int(line.rsplit(" ", 1)[1]))
    print("\n".join(lines))
    print("  -> one at a time, and every acquisition got a larger fencing token")

    heading("3. A holder is killed (SIGKILL) while holding the lock with --ttl 3")
    victim = subprocess.Popen(
        [*CORRAL, "run", name, "--ttl", "3", "--", "sleep", "60"],
        start_new_session=True,
    )
    while (info := store.lock_info(name)) is None:
        time.sleep(0.05)
    os.killpg(victim.pid, signal.SIGKILL)
    victim.wait()
    print(f"  killed: {info.owner} (token {info.token})")
    status = subprocess.run([*CORRAL, "status", name], capture_output=True, text=True)
    print("  corral status right after:", status.stdout.strip().replace("\n", "; "))
    began = time.monotonic()
    proc = run(name, 6, "--ttl", "10", "--wait", "30", hold=0)
    out, err = proc.communicate()
    print(out.rstrip())
    print(
        f"  -> the next one got it {time.monotonic() - began:.1f} s later, when the dead "
        "holder's TTL ran out (never before), with a larger token"
    )
    print("\nTry it yourself:  .venv/bin/corral run my-job --wait 0 -- sleep 10   (twice)")


if __name__ == "__main__":
    main()
