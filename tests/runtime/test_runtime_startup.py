"""The engine's start-up phase, read from SGLang's log: the parser on SGLang 0.5.23's own lines,
the supervisor's output pumps (the engine's bytes pass through unchanged and at once, whatever
the tracking does), the sidecar's /v1/status "start" and moe_runtime_start_phase, and `launch`
end to end with the fake engine printing 0.5.23's lines.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest
from rt_helpers import free_port, metric
from test_runtime_launch import finish, start
from test_runtime_sidecar import sidecar

from moe_contract.startup import START_PHASES
from moe_runtime.launcher.startup import MARKERS, MAX_LINE, LineBuffer, StartTracker
from moe_runtime.launcher.supervisor import Supervisor
from moe_runtime.sidecar.metrics import RuntimeMetrics
from moe_runtime.sidecar.service import EngineCheck
from moe_runtime.sidecar.state import SidecarState

PREFIX = "[2026-01-01 00:00:00 DP3 TP3 EP3] "
# SGLang 0.5.23's lines of a DeepSeek-V3 decode start (one rank), in order, with their neighbours
START_LOG = [
    ("Init parallel begin.", "distributed_init"),
    ("Init parallel ends. elapsed=2.31 s", None),
    ("Load weight begin. avail mem=138.52 GB", "loading_weights"),
    ("Loading safetensors checkpoint shards:  50% Completed | 81/163 [03:20<03:22,  2.47s/it]", None),
    ("Load weight end. elapsed=412.07 s, type=DeepseekV3ForCausalLM, avail mem=62.18 GB.", None),
    ("KV Cache is allocated. dtype: torch.bfloat16, #tokens: 412736, KV size: 27.01 GB", "kv_cache"),
    ("Memory pool end. avail mem=31.40 GB", None),
    ("Capture target decode CUDA graph begin. backend=full, num_tokens_per_req=1, avail mem=30.95 GB", "cuda_graphs"),
    ("Entering DeepGEMM JIT Pre-Compile session. It may take a long time (typically 10-20 mins) if you "
     "have not run `sglang.compile_deep_gemm`.", "deepgemm_warmup"),
    ("Try DeepGEMM JIT Compiling for <GROUPED_GEMM_NT_F8F8BF16_MASKED> N=4096, K=7168, num_groups=32 "
     "with all Ms.", None),
    ("Capture target decode CUDA graph end. bs=[1, 2, 4], elapsed=95.20 s, mem usage=1.20 GB.", None),
    ("Start of pd disaggregation warmup ...", "warmup"),
    ("End of disaggregation warmup", None),
    ("The server is fired up and ready to roll!", "ready"),
]  # fmt: skip


def test_phases_follow_sglang_0_5_23_lines_in_order() -> None:
    t = StartTracker(100.0)
    assert t.snapshot(now=105.0) == {"phase": "launching", "since": 5.0, "phases": {"launching": 100.0}}
    entered = {"launching": 100.0}
    for i, (line, phase) in enumerate(START_LOG):
        now = 200.0 + i
        t.feed(PREFIX + line + "\n", now)
        if phase is not None:
            entered[phase] = now
        assert t.phase == list(entered)[-1], line
    snap = t.snapshot(now=300.0)
    assert snap == {"phase": "ready", "since": 300.0 - entered["ready"], "phases": entered}
    assert list(snap["phases"]) == list(START_PHASES)  # the log walks every phase, in the contract's order


def test_earlier_phases_repeats_and_unknown_lines_are_ignored() -> None:
    t = StartTracker(0.0)
    t.feed("[2026-01-01 00:00:00 DP0 TP0 EP0] Load weight begin. avail mem=138.52 GB", 1.0)
    t.feed("[2026-01-01 00:00:00 DP1 TP1 EP1] Init parallel begin.", 2.0)  # a late rank
    t.feed("[2026-01-01 00:00:00 DP1 TP1 EP1] Load weight begin. avail mem=138.52 GB", 3.0)  # a repeat
    t.feed("WARNING: something about NCCL", 4.0)
    t.feed("", 5.0)
    assert t.snapshot(now=10.0) == {
        "phase": "loading_weights",
        "since": 9.0,
        "phases": {"launching": 0.0, "loading_weights": 1.0},
    }
    # skipped phases stay absent (no DeepGEMM, no P/D warmup); a second capture changes nothing
    t.feed(PREFIX + "KV Cache VA upper bound. dtype: torch.bfloat16, #tokens: 1, KV size: 1.00 GB", 11.0)
    t.feed(PREFIX + "Capture target prefill CUDA graph begin. backend=breakable, num_tokens=[8]", 12.0)
    t.feed(PREFIX + "Capture target decode CUDA graph begin. backend=full", 13.0)
    t.feed(PREFIX + "The server is fired up and ready to roll!", 14.0)
    t.feed(PREFIX + "Entering DeepGEMM JIT Pre-Compile session.", 15.0)  # a new shape while serving
    assert t.snapshot(now=20.0)["phases"] == {
        "launching": 0.0,
        "loading_weights": 1.0,
        "kv_cache": 11.0,
        "cuda_graphs": 12.0,
        "ready": 14.0,
    }
    t.advance("kv_cache", 21.0)  # never backwards
    assert t.phase == "ready"


def test_a_huge_line_is_matched_on_its_head() -> None:
    t = StartTracker(0.0)
    t.feed(PREFIX + "Init parallel begin." + "x" * 1_000_000, 1.0)
    assert t.phase == "distributed_init"
    t.feed("x" * MAX_LINE + "Load weight begin.", 2.0)  # past the cap: not read
    assert t.phase == "distributed_init"


def test_line_buffer_splits_any_chunking_and_holds_at_most_its_cap() -> None:
    stream = "first line\nsecond, café\r\nprogress 1%\rprogress 2%\rdone\nunfinished".encode()
    whole = LineBuffer().feed(stream)
    assert whole == ["first line", "second, café", "progress 1%", "progress 2%", "done"]
    byte_by_byte = LineBuffer()
    assert [line for i in range(len(stream)) for line in byte_by_byte.feed(stream[i : i + 1])] == whole
    assert byte_by_byte.feed(b"\n") == ["unfinished"]

    buf = LineBuffer(cap=1024)
    for _ in range(64):  # 1 MB without a newline, in pipe-sized chunks
        assert buf.feed(b"y" * 16384) == []
        assert len(buf._head) == 1024
    assert buf.feed(b"zz\n" + (PREFIX + "Init parallel begin.\n").encode()) == [
        "y" * 1024,
        PREFIX + "Init parallel begin.",
    ]
    assert len(buf._head) == 0


# SGLang 0.5.23's source of each marker (paths under sglang/srt/): the markers are f-strings there
SOURCES = {
    "Init parallel begin.": ("distributed/bootstrap.py", ['logger.info("Init parallel begin.")']),
    "Load weight begin.": ("model_executor/model_runner.py", ['f"Load weight begin. avail mem=']),
    "KV Cache is allocated.": (
        "mem_cache/memory_pool.py",
        ['else "KV Cache"', "{'VA upper bound' if self.post_capture_active else 'is allocated'}. dtype"],
    ),
    "KV Cache VA upper bound.": (
        "mem_cache/memory_pool.py",
        ['else "KV Cache"', "{'VA upper bound' if self.post_capture_active else 'is allocated'}. dtype"],
    ),
    "CUDA graph begin.": (
        "model_executor/model_runner_components/cuda_graph_setup.py",
        [
            'f"Capture {capture_name} CUDA graph begin. "',
            'f"Capture {capture_name} {graph_backend[model_runner.device]} begin. "',
            '"cuda": "CUDA graph",',
        ],
    ),
    "Entering DeepGEMM JIT Pre-Compile session": (
        "layers/deep_gemm_wrapper/compile_utils.py",
        ['"Entering DeepGEMM JIT Pre-Compile session. "'],
    ),
    "Start of pd disaggregation warmup": (
        "entrypoints/http_server.py",
        ['logger.info(f"Start of pd disaggregation warmup ...")'],
    ),
    "The server is fired up and ready to roll!": (
        "entrypoints/http_server.py",
        ['logger.info("The server is fired up and ready to roll!")'],
    ),
}


@pytest.mark.runtime
def test_markers_are_what_sglang_0_5_23_logs() -> None:
    """Runs with the runtime's tests, where the real package is (tests/run.sh), never skipped there."""
    dist = importlib.metadata.distribution("sglang")
    assert dist.version == "0.5.23", f"the markers are SGLang 0.5.23's; sglang {dist.version} is installed"
    assert set(SOURCES) == {marker for marker, _ in MARKERS}
    srt = Path(str(dist.locate_file("sglang/srt")))
    for marker, (path, snippets) in SOURCES.items():
        text = (srt / path).read_text()
        for snippet in snippets:
            assert snippet in text, f"{marker!r}: {snippet!r} not in sglang/srt/{path}"


# ---------------------------------------------------------------- the supervisor's pumps


def _supervise(script: str, on_line: Any) -> int:
    sup = Supervisor([sys.executable, "-c", script], {}, drain_s=1, grace_s=1, on_line=on_line)
    return asyncio.run(asyncio.wait_for(sup.run(), 60))


ENGINE = r"""
import sys
out, err = sys.stdout.buffer, sys.stderr.buffer
out.write(b"on stdout\n"); out.flush()
err.write(b"x" * 1_000_000); err.flush()
err.write(b"\n[2026-01-01 00:00:00 DP0 TP0 EP0] Init parallel begin.\n")
err.write(b"caf\xc3\xa9 \xff\n")
err.write(b"Load weight begin. avail mem=1.00 GB"); err.flush()
"""


def test_engine_output_passes_through_unchanged_and_feeds_the_tracker(
    capfdbinary: pytest.CaptureFixture[bytes],
) -> None:
    t = StartTracker(0.0)
    lines: list[str] = []

    def on_line(line: str) -> None:
        lines.append(line[:40])
        t.feed(line, time.time())

    assert _supervise(ENGINE, on_line) == 0
    out, err = capfdbinary.readouterr()
    assert out == b"on stdout\n"
    assert err == (
        b"x" * 1_000_000
        + b"\n[2026-01-01 00:00:00 DP0 TP0 EP0] Init parallel begin.\ncaf\xc3\xa9 \xff\n"
        + b"Load weight begin. avail mem=1.00 GB"
    )
    # the unfinished last line is the engine's, not a line: only complete ones are matched. The two
    # streams are pumped apart, so their lines interleave in any order; each keeps its own
    assert lines.count("on stdout") == 1
    assert [line for line in lines if line != "on stdout"] == [
        "x" * 40,
        PREFIX.replace("DP3 TP3 EP3", "DP0 TP0 EP0") + "Init p",
        "café \ufffd",
    ]
    assert t.phase == "distributed_init"


def test_a_failing_tracker_never_holds_up_the_engine_or_its_output(
    capfdbinary: pytest.CaptureFixture[bytes],
) -> None:
    def on_line(line: str) -> None:
        raise RuntimeError("boom")

    script = (
        "import sys\nfor i in range(100_000):\n    sys.stderr.write(f'line {i:07d} ' + 'y' * 60 + '\\n')\n"
    )
    assert _supervise(script, on_line) == 0  # 7.4 MB, past any pipe's room
    _, err = capfdbinary.readouterr()
    assert err.count(b"\n") == 100_000 and err.endswith(b"line 0099999 " + b"y" * 60 + b"\n")


def test_output_comes_through_as_written_not_per_line(
    tmp_path: Path, capfdbinary: pytest.CaptureFixture[bytes]
) -> None:
    """A partial line (a progress bar) shows before the engine ends it; SIGTERM still reaches it."""
    go = tmp_path / "go"
    script = (
        "import os, sys, time\nsys.stderr.write('Loading 10%'); sys.stderr.flush()\n"
        f"while not os.path.exists({str(go)!r}):\n    time.sleep(0.02)\n"
        "sys.stderr.write('\\rLoading 100%\\n'); sys.stderr.flush()\ntime.sleep(60)\n"
    )

    async def run() -> int:
        sup = Supervisor([sys.executable, "-c", script], {}, drain_s=0.1, grace_s=5, on_line=lambda _: None)
        task = asyncio.create_task(sup.run())
        seen = b""
        deadline = time.monotonic() + 20
        while b"Loading 10%" not in seen:
            assert time.monotonic() < deadline, seen
            await asyncio.sleep(0.02)
            seen += capfdbinary.readouterr().err
        go.touch()
        while b"Loading 100%\n" not in seen:
            assert time.monotonic() < deadline, seen
            await asyncio.sleep(0.02)
            seen += capfdbinary.readouterr().err
        sup.request_stop()
        return await asyncio.wait_for(task, 20)

    assert asyncio.run(run()) == 128 + signal.SIGTERM


# ---------------------------------------------------------------- the sidecar


def test_state_metrics_and_ready_from_the_health_check(tmp_path: Path) -> None:
    state = SidecarState(tmp_path)
    m = RuntimeMetrics(state)
    assert state.start_status() is None  # `moe-runtime sidecar`, replay: nothing read
    assert metric(generate_latest(m.registry).decode(), "moe_runtime_start_phase", phase="launching") is None
    state.start = StartTracker(time.time())
    state.start.feed(PREFIX + "Load weight begin. avail mem=1.00 GB", time.time())
    text = generate_latest(m.registry).decode()
    for phase in START_PHASES:
        expected = 1.0 if phase == "loading_weights" else 0.0
        assert metric(text, "moe_runtime_start_phase", phase=phase) == expected, phase
    # node ranks >= 1 log no ready line: their first ready health check ends the start
    state.engine_ready = False
    assert state.start.phase == "loading_weights"
    state.engine_ready = True
    assert state.engine_ready and state.start.phase == "ready"
    assert metric(generate_latest(m.registry).decode(), "moe_runtime_start_phase", phase="ready") == 1.0


def test_status_reports_the_start_phase(tmp_path: Path) -> None:
    async def run() -> None:
        down = EngineCheck(f"http://127.0.0.1:{free_port()}/ready", timeout_s=0.2)  # nothing listens
        async with sidecar(tmp_path, engine_check=down) as (side, c):
            assert (await c.api.get("/v1/status")).json()["start"] is None
            side.state.start = tracker = StartTracker(time.time() - 30)
            tracker.feed(PREFIX + "Init parallel begin.", time.time() - 10)
            st = (await c.api.get("/v1/status")).json()
            assert st["start"]["phase"] == "distributed_init" and 9 < st["start"]["since"] < 60
            assert list(st["start"]["phases"]) == ["launching", "distributed_init"]
            assert st["engine"]["ready"] is False
            assert metric(await c.scrape(), "moe_runtime_start_phase", phase="distributed_init") == 1.0

    asyncio.run(run())


# ---------------------------------------------------------------- `launch` with the fake engine


def test_launch_reports_the_phase_from_the_engine_log(tmp_path: Path) -> None:
    gate = tmp_path / "schedulers-ready"
    pod = start(tmp_path, {"FAKE_START_LOG": "1", "FAKE_READY_FILE": str(gate)})
    try:

        def phase(name: str) -> Any:
            start_ = pod.api.get("/v1/status").json()["start"]
            return start_["phase"] == name and start_

        st = pod.wait(lambda: phase("deepgemm_warmup"), what="the DeepGEMM phase")
        assert list(st["phases"]) == list(START_PHASES[:6])
        assert pod.ready().status_code == 503
        gate.touch()
        st = pod.wait(lambda: phase("ready"), what="ready")
        assert list(st["phases"]) == list(START_PHASES)  # decode: P/D warmup included
        times = list(st["phases"].values())
        assert times == sorted(times)
        pod.proc.send_signal(signal.SIGTERM)
        code, out = finish(pod)
        assert code == 0, out
        # everything the engine printed is in the pod's log, line by line, in order
        printed = [
            line.split("] ", 1)[1] for line in out.splitlines() if line.startswith("[") and "] " in line
        ]
        markers = [m for m in printed if any(m.startswith(marker) for marker, _ in MARKERS)]
        assert markers[:3] == [
            "Init parallel begin.",
            "Init parallel begin.",
            "Load weight begin. avail mem=138.52 GB",
        ]
        assert markers[-2:] == [
            "Start of pd disaggregation warmup ...",
            "The server is fired up and ready to roll!",
        ]
        assert "Memory pool end. avail mem=31.40 GB" in printed
    finally:
        pod.close()
        if pod.proc.poll() is None:
            pod.kill()


def test_a_worker_rank_is_ready_when_its_health_check_is(tmp_path: Path) -> None:
    """SGLang's node ranks >= 1 log nothing when ready: the sidecar's health check ends their start."""
    gate = tmp_path / "schedulers-ready"
    pod = start(
        tmp_path,
        {"FAKE_START_LOG": "1", "FAKE_READY_FILE": str(gate), "MOE_RANK": "1",
         "MOE_LEADER_ADDRESS": "leader.example", "MOE_NNODES": "2"},
        parallel={"nnodes": 2, "gpusPerNode": 8},
        eplb={"numRedundantExperts": 16},
    )  # fmt: skip
    try:
        pod.wait(
            lambda: pod.api.get("/v1/status").json()["start"]["phase"] == "deepgemm_warmup", what="DeepGEMM"
        )
        gate.touch()
        pod.wait(lambda: pod.ready().status_code == 200, what="ready")
        st = pod.wait(
            lambda: (s := pod.api.get("/v1/status").json()["start"])["phase"] == "ready" and s, what="ready"
        )
        assert "warmup" not in st["phases"] and "fired up" not in pod.output()
    finally:
        pod.proc.send_signal(signal.SIGTERM)
        finish(pod)
        pod.close()
