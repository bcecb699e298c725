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
$FAKE_IGNORE_TERM=1, $FAKE_EXIT_AFTER (seconds), $FAKE_START_LOG=1 (print SGLang 0.5.23's
start-up log lines on stderr, in its order: up to the graph capture at once, rank 0's P/D warmup
when the schedulers are "ready", its "ready" line once the port listens). Like uvicorn under
SGLang, it exits 1 when it cannot bind its port (a process that stays up without listening is
not what SGLang does).
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
disaggregated = "--disaggregation-mode" in argv
start_log = os.environ.get("FAKE_START_LOG") == "1"
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


def log(message: str, ranks: int = 2) -> None:
    """A line as SGLang's schedulers log it (sglang/srt/utils/common.py:configure_logger), once per rank."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    for tp in range(ranks):
        print(f"[{stamp} DP{tp} TP{tp} EP{tp}] {message}", file=sys.stderr, flush=True)


def log_start() -> None:
    """SGLang 0.5.23's lines up to the graph capture, in its order (file:function of each in
    moe_runtime.launcher.startup.MARKERS), with some that mark no phase in between."""
    log("Init parallel begin.")
    log("Init parallel ends. elapsed=2.31 s")
    log("Load weight begin. avail mem=138.52 GB")
    log(
        "Load weight end. elapsed=412.07 s, type=DeepseekV3ForCausalLM, avail mem=62.18 GB, mem usage=76.34 GB."
    )
    log("KV Cache is allocated. dtype: torch.bfloat16, #tokens: 412736, KV size: 27.01 GB")
    log("Memory pool end. avail mem=31.40 GB")
    log("Capture target decode CUDA graph begin. backend=full, num_tokens_per_req=1, avail mem=30.95 GB")
    log(
        "Entering DeepGEMM JIT Pre-Compile session. It may take a long time (typically 10-20 mins) "
        "if you have not run `sglang.compile_deep_gemm`.",
        ranks=1,  # first rank of the node only
    )
    log(
        "Try DeepGEMM JIT Compiling for <GROUPED_GEMM_NT_F8F8BF16_MASKED> N=4096, K=7168, num_groups=32 with all Ms."
    )
    log(
        "Capture target decode CUDA graph end. bs=[1, 2, 4, 8], elapsed=95.20 s, mem usage=1.20 GB, avail mem=29.75 GB."
    )


def log_warmup() -> None:
    """Rank 0's P/D warmup (SGLang's /ready answers 503 until it is done, the fake's port does not
    listen yet); node ranks >= 1 print nothing more."""
    if node_rank == 0 and disaggregated:
        log("Start of pd disaggregation warmup ...", ranks=1)
        log("End of disaggregation warmup", ranks=1)


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
    if start_log:
        log_warmup()
    try:
        server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    except OSError as exc:  # uvicorn under SGLang exits when it cannot bind; so does the fake
        print(
            f"fake sglang.launch_server: cannot listen on 127.0.0.1:{port}: {exc}",
            file=sys.stderr,
            flush=True,
        )
        os._exit(1)
    if start_log and node_rank == 0:
        log("The server is fired up and ready to roll!", ranks=1)
    server.serve_forever()


if start_log:
    log_start()
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
