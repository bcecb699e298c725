"""Fake `python -m sglang.launch_server`, shaped like SGLang 0.5.23's HTTP surface.

Node rank 0 serves /ready, /health, /health_generate, /metrics and, with
--expert-distribution-recorder-mode, the recorder endpoints (a dump writes a stat-mode file
into $SGLANG_EXPERT_DISTRIBUTION_RECORDER_DIR like rank 0 does). Ranks with --node-rank >= 1
serve only the placeholder /health and /health_generate (no /ready), as SGLang's
launch_dummy_health_check_server does once the schedulers are ready.

Knobs: $FAKE_READY_AFTER (seconds before the schedulers are "ready" and the port listens),
$FAKE_READY_FILE (no listening before this file exists),
$FAKE_HANG_FILE (while it exists every request hangs: a stuck rank), $FAKE_CALLS (a file that
gets one line per recorder call), $FAKE_RECORD (argv and env), $FAKE_EXIT_CODE (on SIGTERM),
$FAKE_IGNORE_TERM=1, $FAKE_EXIT_AFTER (seconds). Like uvicorn under SGLang, it exits 1 when it
cannot bind its port (a process that stays up without listening is not what SGLang does).
"""

import json
import os
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

argv = sys.argv[1:]
port = int(argv[argv.index("--port") + 1])
node_rank = int(argv[argv.index("--node-rank") + 1]) if "--node-rank" in argv else 0
recording = "--expert-distribution-recorder-mode" in argv
record = os.environ.get("FAKE_RECORD")
if record:
    with open(record, "w") as fh:
        json.dump(
            {"argv": argv, "env": {k: v for k, v in os.environ.items() if k.startswith(("MOE_", "SGLANG_"))}},
            fh,
        )


def note(call: str) -> None:
    calls = os.environ.get("FAKE_CALLS")
    if calls:
        with open(calls, "a") as fh:
            fh.write(call + "\n")


def dump() -> None:
    import numpy as np

    from moe_runtime import recorder

    layers, experts = 4, 16
    counts = np.zeros((8, layers, experts), dtype=np.int32)
    counts[:5, 1:, :] = 3  # five passes recorded, dense layer 0
    out = Path(os.environ.get("SGLANG_EXPERT_DISTRIBUTION_RECORDER_DIR", "/tmp"))
    out.mkdir(parents=True, exist_ok=True)
    recorder.write_dump(out / recorder.dump_name(), counts)


class Handler(BaseHTTPRequestHandler):
    def _answer(self) -> None:
        hang = os.environ.get("FAKE_HANG_FILE")
        while hang and os.path.exists(hang):
            time.sleep(0.05)
        path = self.path.split("?")[0]
        paths = {"/health", "/health_generate"}
        if node_rank == 0:
            paths |= {"/ready", "/metrics"}
            if recording:
                paths |= {"/start_expert_distribution_record", "/dump_expert_distribution_record"}
        if path not in paths:
            self.send_response(404)
            self.end_headers()
            return
        if path.endswith("_expert_distribution_record"):
            note(f"{self.command} {path}")
            if path.startswith("/dump"):
                dump()
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = _answer
    do_POST = _answer

    def log_message(self, *args: object) -> None:
        pass


def serve() -> None:
    time.sleep(float(os.environ.get("FAKE_READY_AFTER", "0")))
    gate = os.environ.get("FAKE_READY_FILE")
    while gate and not os.path.exists(gate):
        time.sleep(0.05)
    try:
        server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    except OSError as exc:  # uvicorn under SGLang exits when it cannot bind; so does the fake
        print(
            f"fake sglang.launch_server: cannot listen on 127.0.0.1:{port}: {exc}",
            file=sys.stderr,
            flush=True,
        )
        os._exit(1)
    server.serve_forever()


threading.Thread(target=serve, daemon=True).start()


def on_term(signum: int, frame: object) -> None:
    marker = os.environ.get("FAKE_TERM_MARKER")
    if marker:
        with open(marker, "w") as fh:
            fh.write("terminated")
    os._exit(int(os.environ.get("FAKE_EXIT_CODE", "0")))


if os.environ.get("FAKE_IGNORE_TERM") == "1":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
else:
    signal.signal(signal.SIGTERM, on_term)
exit_after = os.environ.get("FAKE_EXIT_AFTER")
if exit_after:
    threading.Timer(float(exit_after), lambda: os._exit(int(os.environ.get("FAKE_EXIT_CODE", "0")))).start()
# Short sleeps, not one blocking wait: the kernel may hand SIGTERM to the HTTP thread, and Python
# runs handlers only in the main thread, which a lock wait would never wake from.
while True:
    time.sleep(0.2)
