"""Background processes of the demo (replay runtimes, Prometheus), each with a pid file.

Every command line names the demo's state directory, so `stop` kills only processes this
demo started, even if the pid was reused by something else after a crash.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path


def start(name: str, argv: list[str], pid_dir: Path, log: Path) -> int:
    """Start argv detached (own session, survives the demo's shell); record its pid."""
    pid_dir.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        proc = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )
    (pid_dir / f"{name}.pid").write_text(str(proc.pid))
    # Popen returns once the kernel released the parent, which can be before the new command
    # line is visible in /proc: wait for it, so alive() right after start() is accurate.
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and proc.poll() is None and argv[-1] not in _cmdline(proc.pid):
        time.sleep(0.02)
    return proc.pid


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def alive(pid: int, marker: str) -> bool:
    """The pid runs (not a zombie) and its command line names ``marker`` (our state directory)."""
    return marker in _cmdline(pid) and _state(pid) not in ("", "Z", "X")


def running(pid_dir: Path, marker: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for f in sorted(pid_dir.glob("*.pid")) if pid_dir.is_dir() else []:
        with contextlib.suppress(ValueError):
            pid = int(f.read_text().strip())
            if alive(pid, marker):
                out[f.stem] = pid
    return out


def stop_all(pid_dir: Path, marker: str, grace_s: float = 10.0) -> list[str]:
    """SIGTERM every recorded process, SIGKILL what is left after ``grace_s``; remove pid files."""
    procs = running(pid_dir, marker)
    for pid in procs.values():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(alive(p, marker) for p in procs.values()):
        time.sleep(0.2)
    for pid in procs.values():
        if alive(pid, marker):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    for f in pid_dir.glob("*.pid") if pid_dir.is_dir() else []:
        f.unlink(missing_ok=True)
    return sorted(procs)
