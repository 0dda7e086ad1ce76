"""The `corral` command line, run as a real process over an SQLite file shared by processes.

Only an executable in its own process shows what scripts see: exit statuses,
signals, the environment of the command, stderr. Waits use generous timeouts
and files the child writes, never timing thresholds. Where the store matters
(hints naming it, a lost lock, corral's death) tests also run on Redis.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

TIMEOUT = 30.0
# Short, so that a forced release is noticed soon (at the next renewal, a third of it);
# long enough that a renewal a busy machine delays by a second still comes in time.
SHORT_TTL = "3"


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/locks.db"


@pytest.fixture
def env(tmp_path: Path, url: str) -> dict[str, str]:
    """CORRAL_URL set, so no test can touch the user's default lock file."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    environ["CORRAL_URL"] = url
    environ["XDG_CACHE_HOME"] = str(tmp_path / "cache")
    return environ


@pytest.fixture
def default_env(env: dict[str, str]) -> dict[str, str]:
    """No CORRAL_URL: the embedded default, in a cache directory under the test's."""
    return {k: v for k, v in env.items() if k != "CORRAL_URL"}


Corral = Callable[..., subprocess.CompletedProcess[str]]
Start = Callable[..., "subprocess.Popen[str]"]


@pytest.fixture
def corral(env: dict[str, str]) -> Corral:
    def invoke(
        *args: str, environ: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "corral", *args],
            env=env if environ is None else environ,
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
        )

    return invoke


@pytest.fixture
def start(env: dict[str, str]) -> Iterator[Start]:
    """A `corral` in the background, in its own session so no terminal signal reaches it."""
    started: list[subprocess.Popen[str]] = []

    def spawn(*args: str, environ: dict[str, str] | None = None) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, "-m", "corral", *args],
            env=env if environ is None else environ,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        started.append(proc)
        return proc

    yield spawn
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def wait_for(path: Path, proc: subprocess.Popen[str] | None = None) -> str:
    """The content of a file the command writes once it is ready."""
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().endswith("\n"):
            return path.read_text()
        if proc is not None and proc.poll() is not None:
            _, err = proc.communicate()
            pytest.fail(f"corral exited {proc.returncode} early: {err}")
        time.sleep(0.02)
    pytest.fail(f"{path} was not written within {TIMEOUT} s")


def finish(proc: subprocess.Popen[str]) -> tuple[int, str]:
    _, err = proc.communicate(timeout=TIMEOUT)
    return proc.returncode, err


def status(corral: Corral, name: str) -> dict[str, object]:
    result = corral("status", name, "--json")
    assert result.returncode == 0, result.stderr
    found: dict[str, object] = json.loads(result.stdout)
    return found


def running(pid: int) -> bool:
    """Whether `pid` still runs code: a zombie waiting for init to reap it does not."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: ask the kernel, which counts zombies as alive
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    return stat.rpartition(b")")[2].split()[0] not in (b"Z", b"X")


def dead(pid: int) -> bool:
    return not running(pid)


def wait_gone(*pids: int) -> None:
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        if not any(running(pid) for pid in pids):
            return
        time.sleep(0.02)
    pytest.fail(f"still running after {TIMEOUT} s: {[p for p in pids if running(p)]}")


@pytest.fixture
def leftovers() -> Iterator[list[int]]:
    """Pids a test expects gone; whatever still runs at the end is killed, pass or fail."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        if running(pid):
            os.kill(pid, signal.SIGKILL)


# A command that writes its pid and lock environment, then runs until stopped or
# until the file named by its second argument appears.
SLEEPER = """
import os, sys, time
ready = sys.argv[1]
with open(ready + ".tmp", "w") as f:
    f.write(f"{os.getpid()} {os.environ['CORRAL_LOCK_NAME']} {os.environ['CORRAL_LOCK_TOKEN']}\\n")
os.replace(ready + ".tmp", ready)
go = sys.argv[2] if len(sys.argv) > 2 else None
deadline = time.monotonic() + 60
while time.monotonic() < deadline and not (go and os.path.exists(go)):
    time.sleep(0.02)
"""


def test_command_sees_the_lock_and_its_exit_status_passes_through(
    corral: Corral, tmp_path: Path
) -> None:
    out = tmp_path / "env"
    code = (
        "import os, sys; open(sys.argv[1], 'w').write("
        "os.environ['CORRAL_LOCK_NAME'] + ' ' + os.environ['CORRAL_LOCK_TOKEN']); "
        "sys.exit(int(sys.argv[2]))"
    )
    first = corral("run", "job", "--", *python(code), str(out), "0")
    assert first.returncode == 0, first.stderr
    name, token = out.read_text().split()
    assert name == "job"
    second = corral("run", "job", "--", *python(code), str(out), "3")
    assert second.returncode == 3, second.stderr
    assert int(out.read_text().split()[1]) > int(token)
    assert status(corral, "job")["held"] is False


def test_command_killed_by_a_signal_gives_128_plus_n(corral: Corral) -> None:
    code = "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"
    result = corral("run", "job", "--", *python(code))
    assert result.returncode == 128 + signal.SIGTERM, result.stderr


def test_options_after_the_double_dash_belong_to_the_command(
    corral: Corral, tmp_path: Path
) -> None:
    out = tmp_path / "argv"
    code = "import sys, json; open(sys.argv[1], 'w').write(json.dumps(sys.argv[2:]))"
    result = corral("run", "job", "--ttl", "5", "--", *python(code), str(out), "--ttl", "--", "x")
    assert result.returncode == 0, result.stderr
    assert json.loads(out.read_text()) == ["--ttl", "--", "x"]


def test_busy_lock_exits_75_naming_the_holder_then_wait_gets_it_with_a_larger_token(
    corral: Corral, start: Start, tmp_path: Path
) -> None:
    ready, go = tmp_path / "ready", tmp_path / "go"
    holder = start("run", "job", "--", *python(SLEEPER), str(ready), str(go))
    _, _, token = wait_for(ready, holder).split()

    busy = corral("run", "job", "--wait", "0", "--", "true")
    assert busy.returncode == 75
    assert "'job'" in busy.stderr
    assert f":{holder.pid}:" in busy.stderr  # the owner names the holder's pid
    assert " s left" in busy.stderr
    assert "Traceback" not in busy.stderr

    later, now = tmp_path / "later", tmp_path / "now"
    waiter = start("run", "job", "--wait", "25", "--", *python(SLEEPER), str(later), str(now))
    go.touch()  # the holder's command finishes; the waiter takes the lock
    assert finish(holder)[0] == 0
    now.touch()
    returncode, err = finish(waiter)
    assert returncode == 0, err
    assert int(later.read_text().split()[2]) > int(token)


def test_status_json_shows_holder_and_token(
    corral: Corral, start: Start, tmp_path: Path, url: str
) -> None:
    assert status(corral, "job") == {
        "name": "job",
        "held": False,
        "owner": None,
        "token": None,
        "ttl": None,
        "server": url,
        "semaphore": None,
        "election": None,
    }
    ready = tmp_path / "ready"
    holder = start("run", "job", "--", *python(SLEEPER), str(ready))
    _, _, token = wait_for(ready, holder).split()
    found = status(corral, "job")
    assert found["held"] is True
    assert f":{holder.pid}:" in str(found["owner"])
    assert found["token"] == int(token)
    assert isinstance(found["ttl"], float) and 0 < found["ttl"] <= 30
    human = corral("status", "job")
    assert human.returncode == 0
    assert "held by" in human.stdout and f"fencing token {token}" in human.stdout
    holder.send_signal(signal.SIGTERM)
    finish(holder)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_stop_signals_reach_the_command_and_the_lock_is_released(
    corral: Corral, start: Start, tmp_path: Path, signum: signal.Signals
) -> None:
    ready, got = tmp_path / "ready", tmp_path / "got"
    code = f"""
import signal, sys, time
def stop(signum, frame):
    open({str(got)!r}, "w").write(str(signum))
    sys.exit(4)
signal.signal(signal.SIGTERM, stop)
signal.signal(signal.SIGINT, stop)
open({str(ready)!r}, "w").write("ready\\n")
time.sleep(60)
"""
    runner = start("run", "job", "--", *python(code))
    wait_for(ready, runner)
    runner.send_signal(signum)
    returncode, err = finish(runner)
    assert got.read_text() == str(int(signum))
    assert returncode == 4, err
    assert status(corral, "job")["held"] is False


def test_forced_release_stops_the_command_and_exits_70(
    corral: Corral, start: Start, tmp_path: Path, url: str
) -> None:
    ready = tmp_path / "ready"
    runner = start("run", "job", "--ttl", SHORT_TTL, "--", *python(SLEEPER), str(ready))
    pid, _, token = wait_for(ready, runner).split()

    freed = corral("release", "job", "--force")
    assert freed.returncode == 0, freed.stderr
    assert f"fencing token {token}" in freed.stdout

    returncode, err = finish(runner)
    assert returncode == 70, err
    assert dead(int(pid))
    assert "lost lock 'job'" in err and url in err and f"fencing token {token}" in err
    assert "Traceback" not in err


def test_a_command_ignoring_sigterm_is_killed_after_the_grace(
    corral: Corral, start: Start, tmp_path: Path
) -> None:
    ready = tmp_path / "ready"
    code = f"""
import signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
import os
open({str(ready)!r}, "w").write(str(os.getpid()) + "\\n")
time.sleep(60)
"""
    runner = start("run", "job", "--ttl", SHORT_TTL, "--grace", "0.5", "--", *python(code))
    pid = int(wait_for(ready, runner))
    assert corral("release", "job", "--force").returncode == 0
    returncode, err = finish(runner)
    assert returncode == 70, err
    assert dead(pid)


def test_release_without_force_is_refused(corral: Corral, start: Start, tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    holder = start("run", "job", "--", *python(SLEEPER), str(ready))
    wait_for(ready, holder)
    refused = corral("release", "job")
    assert refused.returncode == 2
    assert "--force" in refused.stderr
    assert status(corral, "job")["held"] is True
    holder.send_signal(signal.SIGTERM)
    finish(holder)
    free = corral("release", "job", "--force")
    assert free.returncode == 0 and "not held" in free.stdout


def test_hold_for_keeps_the_lock_closed_after_the_command(corral: Corral) -> None:
    first = corral("run", "job", "--hold-for", "2", "--", "true")
    assert first.returncode == 0, first.stderr
    second = corral("run", "job", "--", "true")
    assert second.returncode == 75
    assert "hold_for" in second.stderr
    closed = status(corral, "job")
    assert closed["held"] is True and closed["owner"] is None


def test_bad_ttl_is_a_config_error(corral: Corral) -> None:
    result = corral("run", "job", "--ttl", "-1", "--", "true")
    assert result.returncode == 2
    assert "--ttl" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("limit", ["0", "-3", "2.5", "three", str(2**31)])
def test_bad_limit_is_a_config_error(corral: Corral, tmp_path: Path, limit: str) -> None:
    ran = tmp_path / "ran"
    result = corral("run", "job", "--limit", limit, "--", "touch", str(ran))
    assert result.returncode == 2, result.stderr
    assert "--limit" in result.stderr and "Traceback" not in result.stderr
    assert not ran.exists()


def test_limit_one_is_the_lock_not_a_semaphore(corral: Corral, tmp_path: Path) -> None:
    """A lock and a semaphore of one name are different things on the server."""
    out = tmp_path / "env"
    code = "import os, sys; open(sys.argv[1], 'w').write(os.environ['CORRAL_LOCK_TOKEN'])"
    result = corral("run", "job", "--limit", "1", "--hold-for", "30", "--", *python(code), str(out))
    assert result.returncode == 0, result.stderr
    assert status(corral, "job")["held"] is True  # the lock is kept closed, as without --limit


def test_missing_command_gives_127_and_leaves_the_lock_free(corral: Corral, tmp_path: Path) -> None:
    result = corral("run", "job", "--", str(tmp_path / "no-such-command"))
    assert result.returncode == 127
    assert "not found" in result.stderr and "Traceback" not in result.stderr
    assert status(corral, "job")["held"] is False


def test_no_command_is_a_usage_error(corral: Corral) -> None:
    assert corral("run", "job").returncode == 2
    without_dashes = corral("run", "job", "true")
    assert without_dashes.returncode == 2 and "--" in without_dashes.stderr


def test_passwords_never_appear_and_config_errors_exit_2(corral: Corral) -> None:
    url = "redis+cluster://user:s3cret@db.example:7000?no_such_option=1"
    result = corral("status", "job", "--url", url)
    assert result.returncode == 2
    assert "s3cret" not in result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    # Nothing listens on port 1: the server is unavailable, and says so without the password.
    result = corral("status", "job", "--url", "redis://user:s3cret@127.0.0.1:1/0")
    assert result.returncode == 69
    assert "127.0.0.1:1" in result.stderr
    assert "s3cret" not in result.stdout + result.stderr
    assert "Traceback" not in result.stderr


def test_version_help_and_python_m(corral: Corral) -> None:
    import corral as package

    version = corral("--version")
    assert version.returncode == 0 and package.__version__ in version.stdout
    helped = corral("run", "--help")
    assert helped.returncode == 0
    for status_code in ("69", "70", "75", "127"):
        assert status_code in helped.stdout


def at_a_terminal(argv: list[str], env: dict[str, str], keys: bytes) -> tuple[int, bytes]:
    """Run `argv` as the foreground job of a new terminal; type `keys` once it prints READY."""
    import pty
    import select

    pid, fd = pty.fork()
    if pid == 0:  # pragma: no cover - the child execs at once
        try:
            os.execve(argv[0], argv, env)
        finally:
            os._exit(127)
    output = b""
    wait_status: int | None = None
    try:
        deadline = time.monotonic() + TIMEOUT
        while b"READY" not in output and time.monotonic() < deadline:
            if select.select([fd], [], [], 1.0)[0]:
                output += os.read(fd, 1024)
        assert b"READY" in output, output
        os.write(fd, keys)
        while True:
            if not select.select([fd], [], [], TIMEOUT)[0]:
                break
            try:
                chunk = os.read(fd, 1024)
            except OSError:  # EIO: the other side closed
                break
            if not chunk:
                break
            output += chunk
        _, wait_status = os.waitpid(pid, 0)
    finally:
        os.close(fd)
        if wait_status is None:  # a failed assertion above: do not leave it running
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(wait_status), output


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs a Linux pty")
def test_ctrl_c_at_a_terminal_reaches_the_command_once(
    corral: Corral, env: dict[str, str], tmp_path: Path
) -> None:
    """The command has a session of its own: the terminal signals corral, which passes it on."""
    count = tmp_path / "count"
    code = f"""
import signal, sys, time
seen = []
signal.signal(signal.SIGINT, lambda signum, frame: seen.append(signum))
print("READY", flush=True)
deadline = time.monotonic() + 20
while not seen and time.monotonic() < deadline:
    time.sleep(0.01)
time.sleep(0.5)  # a forwarded duplicate would land in here
open({str(count)!r}, "w").write(str(len(seen)))
sys.exit(7)
"""
    argv = [sys.executable, "-m", "corral", "run", "job", "--", *python(code)]
    # Ctrl-C: the terminal sends SIGINT to its foreground group.
    returncode, output = at_a_terminal(argv, env, b"\x03")
    assert returncode == 7, output
    assert count.read_text() == "1"
    assert status(corral, "job")["held"] is False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs a Linux pty")
def test_the_command_can_read_what_is_typed_at_the_terminal(
    env: dict[str, str], tmp_path: Path
) -> None:
    """In a group of its own but the same session, a read would stop it (SIGTTIN) for good."""
    out = tmp_path / "typed"
    code = f"print('READY', flush=True); open({str(out)!r}, 'w').write(input())"
    argv = [sys.executable, "-m", "corral", "run", "job", "--", *python(code)]
    returncode, output = at_a_terminal(argv, env, b"hello\n")
    assert returncode == 0, output
    assert out.read_text() == "hello"


# -- the command's process group -------------------------------------------------------

# A shell whose work runs in a child (as `sh -c 'a; b'` or make do): it writes its own
# pid and its child's to $1, waits, and would then touch $1.after.
GROUP = 'sleep 1000 & echo "$$ $!" > "$1.tmp" && mv "$1.tmp" "$1"; wait; touch "$1.after"'
# The same, with a child that ignores SIGTERM.
STUBBORN_GROUP = (
    '(trap "" TERM; exec sleep 1000) & echo "$$ $!" > "$1.tmp" && mv "$1.tmp" "$1"; wait'
)


def group_pids(path: Path, proc: subprocess.Popen[str], leftovers: list[int]) -> tuple[int, int]:
    shell, child = (int(word) for word in wait_for(path, proc).split())
    leftovers += [shell, child]
    return shell, child


@pytest.fixture
def store_url(backend_url: str) -> str:
    """The SQLite file or the Redis server, for tests where the store makes a difference."""
    return backend_url


@pytest.mark.backend("sqlite", "redis")
def test_a_lost_lock_stops_the_whole_process_group(
    corral: Corral, start: Start, tmp_path: Path, store_url: str, name: str, leftovers: list[int]
) -> None:
    """`sh -c 'a; b'`: `a` must not work on without the lock, and `b` must never start."""
    pids = tmp_path / "pids"
    runner = start(
        "run",
        name,
        "--url",
        store_url,
        "--ttl",
        SHORT_TTL,
        "--",
        "sh",
        "-c",
        GROUP,
        "sh",
        str(pids),
    )
    shell, child = group_pids(pids, runner, leftovers)

    assert corral("release", name, "--force", "--url", store_url).returncode == 0
    returncode, err = finish(runner)
    assert returncode == 70, err
    assert "process group" in err
    wait_gone(shell, child)
    assert not (tmp_path / "pids.after").exists()


def test_a_child_ignoring_sigterm_is_killed_after_the_grace(
    corral: Corral, start: Start, tmp_path: Path, leftovers: list[int]
) -> None:
    pids = tmp_path / "pids"
    runner = start(
        "run",
        "job",
        "--ttl",
        SHORT_TTL,
        "--grace",
        "0.5",
        "--",
        "sh",
        "-c",
        STUBBORN_GROUP,
        "sh",
        str(pids),
    )
    shell, child = group_pids(pids, runner, leftovers)
    assert corral("release", "job", "--force").returncode == 0
    returncode, err = finish(runner)
    assert returncode == 70, err
    # corral exits only once the whole group is gone, SIGKILLed child included.
    assert dead(shell) and dead(child)


def test_a_forwarded_sigterm_reaches_the_whole_group(
    corral: Corral, start: Start, tmp_path: Path, leftovers: list[int]
) -> None:
    pids = tmp_path / "pids"
    runner = start("run", "job", "--", "sh", "-c", GROUP, "sh", str(pids))
    shell, child = group_pids(pids, runner, leftovers)
    runner.send_signal(signal.SIGTERM)
    returncode, err = finish(runner)
    assert returncode == 128 + signal.SIGTERM, err  # the shell, killed by the forwarded signal
    assert dead(shell) and dead(child)
    assert status(corral, "job")["held"] is False


# Left running by its shell, it reports whether the lock is still held when it is told to stop.
LINGERER = """
import os, signal, sys, time
import corral
url, name, out = sys.argv[1:4]
def stop(signum, frame):
    with corral.connect(url) as store:
        info = store.lock_info(name)
    with open(out + ".tmp", "w") as f:
        f.write("held\\n" if info is not None else "free\\n")
    os.replace(out + ".tmp", out)
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
open(out + ".ready", "w").close()
time.sleep(60)
"""


def test_processes_left_in_the_group_are_stopped_before_the_release(
    corral: Corral, tmp_path: Path, url: str
) -> None:
    out = tmp_path / "seen"
    script = f'"$0" -c "$1" {url} job {out} & while [ ! -e {out}.ready ]; do sleep 0.02; done'
    result = corral("run", "job", "--", "sh", "-c", script, sys.executable, LINGERER)
    assert result.returncode == 0, result.stderr
    assert "left processes running in its process group" in result.stderr
    assert out.read_text() == "held\n"  # still held while they were being stopped
    assert status(corral, "job")["held"] is False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.backend("sqlite", "redis")
def test_the_command_and_its_children_die_with_corral(
    corral: Corral, start: Start, tmp_path: Path, store_url: str, name: str, leftovers: list[int]
) -> None:
    """SIGKILL (or the OOM killer) gives corral no chance to clean up; the group goes anyway."""
    pids = tmp_path / "pids"
    runner = start("run", name, "--url", store_url, "--", "sh", "-c", GROUP, "sh", str(pids))
    shell, child = group_pids(pids, runner, leftovers)
    runner.kill()
    _, err = finish(runner)
    wait_gone(shell, child)
    assert "died while its command ran" in err
    # Nobody released it: it stays held until its TTL runs out, but nothing runs under it.
    found = json.loads(corral("status", name, "--json", "--url", store_url).stdout)
    assert found["held"] is True
    assert corral("release", name, "--force", "--url", store_url).returncode == 0


def launcher_of(corral_pid: int) -> int:
    """The watcher `corral run` leaves beside its command."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if (
            len(argv) > 4
            and argv[3].endswith(b"_launch.py")
            and argv[4] == str(corral_pid).encode()
        ):
            return int(entry.name)
    pytest.fail(f"no watcher for corral {corral_pid}")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_on_linux_the_command_dies_with_corral_even_without_its_watcher(
    start: Start, tmp_path: Path, leftovers: list[int]
) -> None:
    """The kernel's death signal reaches the command itself; the watcher, its children."""
    pids = tmp_path / "pids"
    runner = start("run", "job", "--", "sh", "-c", GROUP, "sh", str(pids))
    shell, child = group_pids(pids, runner, leftovers)
    watcher = launcher_of(runner.pid)
    os.kill(watcher, signal.SIGKILL)
    wait_gone(watcher)
    runner.kill()
    runner.wait(TIMEOUT)
    wait_gone(shell)
    assert running(child)  # as docs/cli.md says: the death signal reaches the command alone
    os.kill(child, signal.SIGKILL)  # it holds corral's stderr open
    finish(runner)


def test_the_launcher_never_starts_a_command_whose_corral_is_gone(tmp_path: Path) -> None:
    """The death signal is only armed for a living parent: a corral that died first is caught."""
    import socket

    from corral.cli import _process

    ran = tmp_path / "ran"
    ours, theirs = socket.socketpair()
    errors_read, errors_write = os.pipe()
    not_the_parent = os.getpid() + 1_000_000  # no such process is our child's parent
    with ours:
        proc = subprocess.Popen(
            [
                *(sys.executable, "-I", "-S", str(_process.LAUNCHER), str(not_the_parent)),
                *(str(theirs.fileno()), str(errors_write), "--", "touch", str(ran)),
            ],
            pass_fds=(theirs.fileno(), errors_write),
            start_new_session=True,
        )
        theirs.close()
        os.close(errors_write)
        assert proc.wait(timeout=TIMEOUT) == -signal.SIGKILL
        os.close(errors_read)
        ours.sendall(_process.DONE)
    assert not ran.exists()


def test_the_command_starts_with_the_signal_dispositions_corral_was_given(
    corral: Corral, env: dict[str, str]
) -> None:
    """Python ignores SIGPIPE for itself; the command must not inherit that. `nohup` must hold."""
    if not Path("/proc/self/status").exists():
        pytest.skip("reads /proc")

    def ignored(result: subprocess.CompletedProcess[str]) -> int:
        assert result.returncode == 0, result.stderr
        line = next(x for x in result.stdout.splitlines() if x.startswith("SigIgn:"))
        return int(line.split()[1], 16)

    plain = ignored(corral("run", "job", "--", "cat", "/proc/self/status"))
    assert not plain & (1 << (signal.SIGPIPE - 1))
    assert not plain & (1 << (signal.SIGHUP - 1))
    nohup = subprocess.run(
        [
            *("sh", "-c", 'trap "" HUP; exec "$@"', "sh", sys.executable, "-m", "corral"),
            *("run", "job", "--", "cat", "/proc/self/status"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert ignored(nohup) & (1 << (signal.SIGHUP - 1))


def process_state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_bytes().rpartition(b")")[2].split()[0].decode()


def wait_state(states: str, *pids: int) -> None:
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        if all(process_state(pid) in states for pid in pids):
            return
        time.sleep(0.02)
    pytest.fail(f"not in state {states!r}: {[(p, process_state(p)) for p in pids]}")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_ctrl_z_stops_the_group_with_corral_and_fg_continues_both(
    corral: Corral, start: Start, tmp_path: Path, leftovers: list[int]
) -> None:
    """A stopped corral renews nothing: its command must not work on meanwhile."""
    pids = tmp_path / "pids"
    runner = start("run", "job", "--", "sh", "-c", GROUP, "sh", str(pids))
    shell, child = group_pids(pids, runner, leftovers)
    runner.send_signal(signal.SIGTSTP)
    wait_state("T", runner.pid, shell, child)
    runner.send_signal(signal.SIGCONT)
    wait_state("SR", runner.pid, shell, child)
    runner.send_signal(signal.SIGTERM)
    returncode, err = finish(runner)
    assert returncode == 128 + signal.SIGTERM, err


def test_a_file_that_cannot_be_executed_gives_126(corral: Corral, tmp_path: Path) -> None:
    script = tmp_path / "script"
    script.write_text("#!/bin/sh\nexit 0\n")  # not executable
    result = corral("run", "job", "--", str(script))
    assert result.returncode == 126
    assert "cannot execute" in result.stderr and "Traceback" not in result.stderr
    assert status(corral, "job")["held"] is False


# -- flock(1)'s conveniences for cron ---------------------------------------------------


@pytest.fixture
def busy(start: Start, tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    """'job' held by another corral until the test ends."""
    ready = tmp_path / "held"
    holder = start("run", "job", "--", *python(SLEEPER), str(ready))
    wait_for(ready, holder)
    yield holder
    holder.send_signal(signal.SIGTERM)
    finish(holder)


@pytest.mark.usefixtures("busy")
def test_conflict_exit_code_chooses_the_busy_status(corral: Corral) -> None:
    assert corral("run", "job", "-E", "0", "--", "true").returncode == 0
    assert corral("run", "job", "--conflict-exit-code", "3", "--", "true").returncode == 3
    waited = corral("run", "job", "-E", "4", "--wait", "0.2", "--", "true")
    assert waited.returncode == 4 and "within 0.2 s" in waited.stderr
    refused = corral("run", "job", "-E", "256", "--", "true")
    assert refused.returncode == 2 and "0 to 255" in refused.stderr


@pytest.mark.usefixtures("busy")
def test_quiet_losers_say_nothing_but_errors_still_print(corral: Corral, tmp_path: Path) -> None:
    ran = tmp_path / "ran"
    quiet = corral("run", "job", "-q", "--", "touch", str(ran))
    assert (quiet.returncode, quiet.stdout, quiet.stderr) == (75, "", "")
    assert not ran.exists()
    unavailable = corral("run", "job", "--quiet", "--url", "redis://127.0.0.1:1/0", "--", "true")
    assert unavailable.returncode == 69 and "127.0.0.1:1" in unavailable.stderr
    assert corral("run", "job", "-q", "-v", "--", "true").returncode == 2


def test_verbose_names_the_store_and_the_token_it_got(
    corral: Corral, tmp_path: Path, url: str
) -> None:
    out = tmp_path / "token"
    code = "import os, sys; open(sys.argv[1], 'w').write(os.environ['CORRAL_LOCK_TOKEN'])"
    result = corral("run", "job", "-v", "--", *python(code), str(out))
    assert result.returncode == 0, result.stderr
    token = out.read_text()
    assert f"store {url} (from CORRAL_URL)" in result.stderr
    assert f"acquired lock 'job' on {url}: fencing token {token}," in result.stderr
    assert "released lock 'job'" in result.stderr


def test_verbose_says_the_embedded_default_is_local(
    corral: Corral, default_env: dict[str, str], tmp_path: Path
) -> None:
    result = corral("run", "job", "--verbose", "--", "true", environ=default_env)
    assert result.returncode == 0, result.stderr
    assert f"sqlite:///{tmp_path / 'cache' / 'corral' / 'corral.db'}" in result.stderr
    assert "embedded default" in result.stderr and "this machine" in result.stderr


@pytest.fixture(scope="module")
def redis_with_password(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from corral.testing import servers
    from tests.conftest import server_missing

    try:
        server = servers.start_redis(tmp_path_factory.mktemp("redis-auth"), password="cli-s3cret")
    except servers.ServerUnavailable as exc:
        server_missing(str(exc))
        raise
    try:
        yield server.url
    finally:
        server.stop()


def test_the_store_is_named_without_its_password(
    corral: Corral, start: Start, tmp_path: Path, redis_with_password: str
) -> None:
    url = redis_with_password
    ready = tmp_path / "ready"
    holder = start("run", "job", "-v", "--url", url, "--", *python(SLEEPER), str(ready))
    wait_for(ready, holder)
    busy = corral("run", "job", "--url", url, "--", "true")
    holder.send_signal(signal.SIGTERM)
    _, holder_err = finish(holder)
    assert "cli-s3cret" not in holder_err + busy.stderr
    assert "***@" in holder_err and "(from --url)" in holder_err
    assert busy.returncode == 75
    assert "`corral status job --url" in busy.stderr and "***" in busy.stderr
    assert "password" in busy.stderr  # says to put it back


# -- memory:// excludes nothing across processes ----------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ("run", "job", "--", "touch"),
        ("elect", "job", "--", "touch"),
        ("status", "job"),
        ("release", "job", "--force"),
    ],
)
def test_memory_store_is_refused(
    corral: Corral, env: dict[str, str], tmp_path: Path, args: tuple[str, ...]
) -> None:
    ran = tmp_path / "ran"
    words = [*args, str(ran)] if args[0] in ("run", "elect") else list(args)
    given = corral(*words[:2], "--url", "memory://", *words[2:])
    from_env = corral(*words, environ={**env, "CORRAL_URL": "memory://"})
    for result in (given, from_env):
        assert result.returncode == 2, result.stderr
        assert "memory://" in result.stderr and "exclude nothing" in result.stderr
        assert "Traceback" not in result.stderr and result.stdout == ""
    assert "(from CORRAL_URL)" in from_env.stderr
    assert not ran.exists()


# -- the busy message names the store ----------------------------------------------------


@pytest.mark.backend("sqlite", "redis")
def test_busy_message_points_at_the_same_store(
    corral: Corral, start: Start, tmp_path: Path, store_url: str, name: str
) -> None:
    ready = tmp_path / "ready"
    holder = start("run", name, "--url", store_url, "--", *python(SLEEPER), str(ready))
    wait_for(ready, holder)
    busy = corral("run", name, "--url", store_url, "--", "true")
    holder.send_signal(signal.SIGTERM)
    finish(holder)
    assert busy.returncode == 75
    assert f"`corral status {name} --url {store_url}`" in busy.stderr


def test_busy_message_on_the_default_store_needs_no_url(
    corral: Corral, start: Start, default_env: dict[str, str], tmp_path: Path
) -> None:
    ready = tmp_path / "ready"
    holder = start("run", "my job", "--", *python(SLEEPER), str(ready), environ=default_env)
    wait_for(ready, holder)
    busy = corral("run", "my job", "--", "true", environ=default_env)
    holder.send_signal(signal.SIGTERM)
    finish(holder)
    assert busy.returncode == 75
    assert "see `corral status 'my job'`" in busy.stderr  # quoted for the shell, no --url


def test_busy_message_says_when_nobody_holds_it_but_hold_for_keeps_it_closed(
    corral: Corral, url: str
) -> None:
    assert corral("run", "job", "--hold-for", "30", "--", "true").returncode == 0
    busy = corral("run", "job", "--", "true")
    assert busy.returncode == 75
    assert "nobody holds it" in busy.stderr and "hold_for" in busy.stderr
    assert f"--url {url}" in busy.stderr  # CORRAL_URL is not the default either
    assert corral("release", "job", "--force").returncode == 0


# -- status creates nothing ----------------------------------------------------------------


def test_status_creates_no_directory(
    corral: Corral, default_env: dict[str, str], tmp_path: Path
) -> None:
    import corral as library

    probe = tmp_path / "probe" / "dir"
    with library.connect(f"sqlite:///{probe}/x.db") as store:
        assert store.lock_info("x") is None
    assert not probe.parent.exists()  # the library's inspect creates nothing
    missing = tmp_path / "missing"
    result = corral("status", "x", "--url", f"sqlite:///{missing}/dir/x.db")
    assert result.returncode == 0, result.stderr
    assert "not held" in result.stdout
    assert not missing.exists()
    default = corral("status", "x", environ=default_env)
    assert default.returncode == 0, default.stderr
    assert not (tmp_path / "cache").exists()


# -- run --limit N: a slot of a semaphore --------------------------------------------------

# Appends "enter TIME TOKEN" once it holds its slot and "exit TIME TOKEN" just before it
# leaves, then writes its ready file; it leaves when the go file appears (or at once
# when none is given).
RECORDER = """
import os, sys, time
log, ready = sys.argv[1:3]
go = sys.argv[3] if len(sys.argv) > 3 else None
token = os.environ["CORRAL_LOCK_TOKEN"]
def record(what):
    with open(log, "a") as f:
        f.write(f"{what} {time.time()!r} {token}\\n")
record("enter")
with open(ready + ".tmp", "w") as f:
    f.write(token + "\\n")
os.replace(ready + ".tmp", ready)
deadline = time.monotonic() + 60
while go and not os.path.exists(go) and time.monotonic() < deadline:
    time.sleep(0.02)
time.sleep(0.1)
record("exit")
"""


def most_at_once(log: Path) -> int:
    """The most commands that were inside at one instant, from their enter/exit records."""
    events = []
    for line in log.read_text().splitlines():
        what, when, _ = line.split()
        events.append((float(when), 0 if what == "exit" else 1))
    inside = most = 0
    for _, enter in sorted(events):
        inside += 1 if enter else -1
        most = max(most, inside)
    assert inside == 0, log.read_text()
    return most


def test_limit_lets_n_commands_in_and_the_others_exit_75_naming_the_holders(
    corral: Corral, start: Start, tmp_path: Path
) -> None:
    log, go = tmp_path / "log", tmp_path / "go"
    runners = [
        start(
            "run",
            "pool",
            "--limit",
            "3",
            "--",
            *python(RECORDER),
            str(log),
            str(tmp_path / f"r{i}"),
            str(go),
        )
        for i in range(5)
    ]
    # Two of them find the three slots taken and give up at once (--wait 0).
    deadline = time.monotonic() + TIMEOUT
    while sum(runner.poll() is not None for runner in runners) < 2:
        assert time.monotonic() < deadline, "no two runs gave up"
        time.sleep(0.02)
    losers = [runner for runner in runners if runner.poll() is not None]
    for loser in losers:
        returncode, err = finish(loser)
        assert returncode == 75, err
        assert "semaphore 'pool'" in err and "3 of its 3 slots taken" in err
        assert err.count("held by") == 3 and "Traceback" not in err
    winners = [i for i, runner in enumerate(runners) if runner not in losers]
    tokens = {wait_for(tmp_path / f"r{i}", runners[i]).strip() for i in winners}
    assert len(tokens) == 3

    found = status(corral, "pool")
    assert found["held"] is False  # the lock of that name is another thing
    semaphore = found["semaphore"]
    assert isinstance(semaphore, dict)
    assert semaphore["limit"] == 3 and semaphore["free"] == 0
    assert {str(holder["token"]) for holder in semaphore["holders"]} == tokens
    human = corral("status", "pool")
    assert "semaphore 'pool'" in human.stdout and "3 of its 3 slots taken" in human.stdout

    go.touch()
    for winner in winners:
        returncode, err = finish(runners[winner])
        assert returncode == 0, err
    assert most_at_once(log) == 3
    assert status(corral, "pool")["semaphore"] is None


def test_limit_with_a_long_wait_lets_everyone_in_at_most_n_at_once(
    corral: Corral, start: Start, tmp_path: Path
) -> None:
    log = tmp_path / "log"
    runners = [
        start(
            "run",
            "pool",
            "--limit",
            "3",
            "--wait",
            "60",
            "--",
            *python(RECORDER),
            str(log),
            str(tmp_path / f"r{i}"),
        )
        for i in range(5)
    ]
    for runner in runners:
        returncode, err = finish(runner)
        assert returncode == 0, err
    assert len(log.read_text().splitlines()) == 10
    assert most_at_once(log) <= 3


def test_limit_must_agree_with_the_holders(corral: Corral, start: Start, tmp_path: Path) -> None:
    ready, go = tmp_path / "ready", tmp_path / "go"
    holder = start(
        "run",
        "pool",
        "--limit",
        "3",
        "--",
        *python(RECORDER),
        str(tmp_path / "log"),
        str(ready),
        str(go),
    )
    wait_for(ready, holder)
    other = corral("run", "pool", "--limit", "2", "--", "true")
    go.touch()
    assert finish(holder)[0] == 0
    assert other.returncode == 2, other.stderr
    assert "limit=3" in other.stderr and "Traceback" not in other.stderr


def test_forced_release_frees_the_slots_and_stops_their_commands(
    corral: Corral, start: Start, tmp_path: Path
) -> None:
    ready, out = tmp_path / "ready", tmp_path / "out"
    holder = start(
        "run",
        "pool",
        "--limit",
        "2",
        "--ttl",
        SHORT_TTL,
        "--",
        *python(RECORDER),
        str(out),
        str(ready),
        str(tmp_path / "go"),
    )
    token = wait_for(ready, holder).strip()
    freed = corral("release", "pool", "--force")
    assert freed.returncode == 0, freed.stderr
    assert "semaphore 'pool'" in freed.stdout and "freed 1 slot" in freed.stdout
    assert f"fencing token {token}" in freed.stdout
    returncode, err = finish(holder)
    assert returncode == 70, err
    assert "lost a slot of semaphore 'pool' (limit 2)" in err


# -- elect ---------------------------------------------------------------------------------

# Appends "enter TIME PID TERM IDENTITY" once elected, writes its pid to the file named
# after its identity, then runs until stopped or until the go file appears.
LEADER = """
import os, sys, time
log, directory = sys.argv[1:3]
go = sys.argv[3] if len(sys.argv) > 3 else None
term = os.environ["CORRAL_LEADER_TERM"]
identity, name = os.environ["CORRAL_LEADER_IDENTITY"], os.environ["CORRAL_LOCK_NAME"]
with open(log, "a") as f:
    f.write(f"enter {time.time()!r} {os.getpid()} {term} {identity} {name}\\n")
path = os.path.join(directory, identity)
with open(path + ".tmp", "w") as f:
    f.write(f"{os.getpid()} {term}\\n")
os.replace(path + ".tmp", path)
deadline = time.monotonic() + 60
while not (go and os.path.exists(go)) and time.monotonic() < deadline:
    time.sleep(0.02)
"""


def entries(log: Path, count: int, proc: subprocess.Popen[str] | None = None) -> list[list[str]]:
    """The first `count` enter records, once there are that many."""
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        text = log.read_text() if log.exists() else ""
        lines = text.splitlines() if text.endswith("\n") else text.splitlines()[:-1]
        if len(lines) >= count:
            return [line.split() for line in lines[:count]]
        if proc is not None and proc.poll() is not None:
            _, err = proc.communicate()
            pytest.fail(f"corral exited {proc.returncode} early: {err}")
        time.sleep(0.02)
    pytest.fail(f"fewer than {count} records in {log} within {TIMEOUT} s")


def test_elect_runs_the_command_as_leader_and_passes_its_exit_status_through(
    corral: Corral, tmp_path: Path
) -> None:
    out = tmp_path / "env"
    code = (
        "import os, sys; open(sys.argv[1], 'w').write(' '.join(os.environ[k] for k in "
        "('CORRAL_LOCK_NAME', 'CORRAL_LEADER_TERM', 'CORRAL_LEADER_IDENTITY'))); sys.exit(3)"
    )
    first = corral("elect", "boss", "--identity", "web 1", "--", *python(code), str(out))
    assert first.returncode == 3, first.stderr
    name, term, identity = out.read_text().split(" ", 2)
    assert (name, identity) == ("boss", "web 1")
    second = corral("elect", "boss", "--", *python(code), str(out))
    assert second.returncode == 3, second.stderr
    assert int(out.read_text().split()[1]) > int(term)
    assert status(corral, "boss")["election"] is None  # resigned on the command's exit


def test_elect_waits_for_the_leader_and_is_elected_when_it_resigns(
    corral: Corral, start: Start, tmp_path: Path
) -> None:
    log, go = tmp_path / "log", tmp_path / "go"
    leader = start(
        "elect",
        "boss",
        "--identity",
        "one",
        "--",
        *python(LEADER),
        str(log),
        str(tmp_path),
        str(go),
    )
    entries(log, 1, leader)

    busy = corral("elect", "boss", "--wait", "0", "--", "true")
    assert busy.returncode == 75, busy.stderr
    assert "election 'boss'" in busy.stderr and "one leads (term" in busy.stderr

    found = status(corral, "boss")
    election = found["election"]
    assert isinstance(election, dict)
    assert election["leader"] == "one" and str(election["owner"]).startswith("one@")
    assert isinstance(election["ttl"], float) and 0 < election["ttl"] <= 10
    assert found["held"] is False and found["semaphore"] is None
    human = corral("status", "boss")
    assert (
        "election 'boss'" in human.stdout and f"one leads (term {election['term']}," in human.stdout
    )

    follower = start(
        "elect",
        "boss",
        "--identity",
        "two",
        "--",
        *python(LEADER),
        str(log),
        str(tmp_path),
        str(go),
    )
    go.touch()  # the leader's command exits; corral resigns and the follower is elected
    assert finish(leader)[0] == 0
    returncode, err = finish(follower)
    assert returncode == 0, err
    (_, _, _, first, who_first, _), (_, _, _, second, who_second, _) = entries(log, 2)
    assert (who_first, who_second) == ("one", "two") and int(second) > int(first)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.backend("sqlite", "redis")
def test_elect_runs_one_leader_at_a_time_and_fails_over_when_the_leader_dies(
    corral: Corral,
    start: Start,
    tmp_path: Path,
    store_url: str,
    name: str,
    backend_name: str,
    leftovers: list[int],
) -> None:
    from tests.conftest import capabilities

    # The follower enters seconds after the kill: gone_at, read even after a pause, is
    # still earlier.
    ttl = 5.0
    log = tmp_path / "log"
    campaigners = {
        f"node-{i}": start(
            "elect",
            name,
            "--url",
            store_url,
            "--ttl",
            str(ttl),
            "--identity",
            f"node-{i}",
            "--",
            *python(LEADER),
            str(log),
            str(tmp_path),
        )
        for i in range(3)
    }
    ((_, _, pid, term, first, _),) = entries(log, 1)
    leftovers.append(int(pid))
    killed_at = time.monotonic()
    campaigners[first].kill()  # no chance to resign: the others wait for the TTL
    finish(campaigners[first])
    wait_gone(int(pid))  # its command died with it
    gone_at = time.time()
    _, (_, entered, pid, second_term, second, _) = entries(log, 2)
    failover = time.monotonic() - killed_at
    leftovers.append(int(pid))
    bound = ttl + capabilities(backend_name).ttl_slack + 5.0
    assert failover <= bound, f"failover took {failover:.1f} s, more than {bound:.1f} s"
    assert second != first and int(second_term) > int(term)
    assert float(entered) > gone_at  # never two commands at once

    campaigners[second].send_signal(signal.SIGTERM)  # forwarded: the command stops, corral resigns
    assert finish(campaigners[second])[0] == 128 + signal.SIGTERM
    _, _, (_, _, pid, third_term, third, _) = entries(log, 3)
    assert third not in (first, second) and int(third_term) > int(second_term)
    campaigners[third].send_signal(signal.SIGTERM)
    assert finish(campaigners[third])[0] == 128 + signal.SIGTERM
    assert len(log.read_text().splitlines()) == 3


def test_forced_release_stops_the_leaders_command_and_exits_70(
    corral: Corral, start: Start, tmp_path: Path
) -> None:
    log = tmp_path / "log"
    leader = start(
        "elect",
        "boss",
        "--ttl",
        SHORT_TTL,
        "--identity",
        "one",
        "--",
        *python(LEADER),
        str(log),
        str(tmp_path),
    )
    ((_, _, pid, term, _, _),) = entries(log, 1, leader)
    freed = corral("release", "boss", "--force")
    assert freed.returncode == 0, freed.stderr
    assert "election 'boss'" in freed.stdout and f"one leads (term {term}," in freed.stdout
    returncode, err = finish(leader)
    assert returncode == 70, err
    assert dead(int(pid))
    assert "lost the leadership of election 'boss'" in err and f"(term {term})" in err
    assert "exiting with status 70" in err and "Traceback" not in err


def test_rejoin_campaigns_again_and_restarts_the_command(
    corral: Corral, start: Start, tmp_path: Path
) -> None:
    log = tmp_path / "log"
    leader = start(
        "elect",
        "boss",
        "--ttl",
        SHORT_TTL,
        "--rejoin",
        "--identity",
        "one",
        "--",
        *python(LEADER),
        str(log),
        str(tmp_path),
    )
    ((_, _, pid, term, _, _),) = entries(log, 1, leader)
    assert corral("release", "boss", "--force").returncode == 0
    _, (_, _, again, new_term, _, _) = entries(log, 2, leader)
    assert dead(int(pid)) and again != pid and int(new_term) > int(term)
    assert status(corral, "boss")["election"] is not None
    leader.send_signal(signal.SIGTERM)
    returncode, err = finish(leader)
    assert returncode == 128 + signal.SIGTERM, err
    assert "campaigning again once it is gone (--rejoin)" in err
    assert status(corral, "boss")["election"] is None
