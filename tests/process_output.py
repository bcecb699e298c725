"""A test subprocess's output, drained as it comes.

A pipe nobody reads blocks the child once it fills (64 KiB): its logging stops and so does it.
Each test that starts a server reads its output on a thread into a list, to show on failure.
"""

from __future__ import annotations

import subprocess
import threading


def follow(proc: subprocess.Popen[str], lines: list[str]) -> threading.Thread:
    """Start a daemon thread appending ``proc``'s stdout lines to ``lines`` until EOF."""
    assert proc.stdout is not None, "start the process with stdout=subprocess.PIPE"
    stdout = proc.stdout
    thread = threading.Thread(target=lambda: lines.extend(stdout), daemon=True)
    thread.start()
    return thread
