"""Fake `python -m sglang.launch_server`: serves /health on --port, records its argv and env,
exits with $FAKE_EXIT_CODE on SIGTERM (or ignores SIGTERM when $FAKE_IGNORE_TERM=1)."""

import json
import os
import signal
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

argv = sys.argv[1:]
port = int(argv[argv.index("--port") + 1])
record = os.environ.get("FAKE_RECORD")
if record:
    with open(record, "w") as fh:
        json.dump(
            {"argv": argv, "env": {k: v for k, v in os.environ.items() if k.startswith(("MOE_", "SGLANG_"))}},
            fh,
        )


class Health(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args):
        pass


server = ThreadingHTTPServer(("127.0.0.1", port), Health)
threading.Thread(target=server.serve_forever, daemon=True).start()


def on_term(signum, frame):
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
threading.Event().wait()
