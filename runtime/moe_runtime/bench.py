"""``moe-runtime bench``: what the runtime costs at DeepSeek-V3 size (61 layers x 256 experts).

Sidecar: a real sidecar process ingests windows from its spool and answers a Prometheus
scrape and an operator collect per window. Time is compressed: windows arrive every
``--compress`` seconds instead of every ``--interval``; the report measures CPU seconds
per window and the idle CPU rate separately and extrapolates to the real cadence:
``(cpu_per_window + idle_rate * interval) / interval``.

Hook: the plugin's own work at a rebalance (spool the window, read and validate the
operator's placement, derive SGLang's tensors, write status), planner excluded.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from moe_placement.document import PlacementDoc
from moe_placement.maps import IntArray, rebalance_outputs, trivial_map
from moe_runtime import eplb_hook, exchange
from moe_runtime.replay.baseline import deepseek_global


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--layers", type=int, default=61)
    p.add_argument("--experts", type=int, default=256)
    p.add_argument("--gpus", type=int, default=32)
    p.add_argument("--redundant", type=int, default=32)
    p.add_argument("--windows", type=int, default=70, help="windows to feed (> the ring size fills it)")
    p.add_argument("--interval", type=float, default=10.0, help="real window cadence to extrapolate to, s")
    p.add_argument("--compress", type=float, default=0.25, help="actual seconds between windows in the bench")
    p.add_argument("--idle", type=float, default=10.0, help="seconds to measure the idle CPU rate")
    p.add_argument("--buffer", type=int, default=1000, help="passes in the engine's recorder buffer")
    p.add_argument("--reps", type=int, default=20, help="hook repetitions")
    p.add_argument("--port", type=int, default=0, help="sidecar port (0: pick a free one)")
    p.add_argument("--skip-sidecar", action="store_true")
    p.add_argument("--skip-hook", action="store_true")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks  # utime + stime


def _rss_mb(pid: int) -> tuple[float, float]:
    vals = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            vals[key] = int(rest.split()[0]) / 1024
    return vals.get("VmRSS", 0.0), vals.get("VmHWM", 0.0)


def _skewed_counts(rng: np.random.Generator, layers: int, experts: int, passes: int) -> IntArray:
    p = rng.dirichlet(np.full(experts, 0.3), size=layers)
    return np.stack([rng.multinomial(passes * 4096 * 8, row) for row in p]).astype(np.int64)


# ---------------------------------------------------------------- sidecar


def bench_sidecar(args: argparse.Namespace) -> dict[str, Any]:
    import httpx

    port = args.port or _free_port()
    probes, scrape = _free_port(), _free_port()
    work = Path(tempfile.mkdtemp(prefix="moe-bench-"))
    (work / "token").write_text("bench")
    cmd = [
        sys.executable,
        "-m",
        "moe_runtime.bench",
        "_sidecar",
        str(port),
        str(probes),
        str(scrape),
        str(work),
        str(args.layers),
        str(args.experts),
        str(args.gpus),
        str(args.redundant),
    ]
    child = subprocess.Popen(cmd)
    base = f"http://127.0.0.1:{port}"
    auth = {"Authorization": "Bearer bench"}
    rng = np.random.default_rng(0)
    try:
        with httpx.Client(timeout=10) as client:
            for _ in range(200):
                try:
                    if client.get(f"http://127.0.0.1:{probes}/healthz").status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.1)
            else:
                raise RuntimeError("sidecar did not start")
            rss_start = _rss_mb(child.pid)
            c0, t0 = _cpu_seconds(child.pid), time.monotonic()
            time.sleep(args.idle)
            idle_rate = (_cpu_seconds(child.pid) - c0) / (time.monotonic() - t0)

            seq = 0
            c1, t1 = _cpu_seconds(child.pid), time.monotonic()
            for i in range(args.windows):
                counts = _skewed_counts(rng, args.layers, args.experts, 1000)
                now = time.time()
                exchange.write_window(
                    work,
                    exchange.WindowRecord(
                        counts,
                        1000,
                        now - args.interval,
                        now,
                        {"num_physical": args.experts + args.redundant, "num_gpus": args.gpus},
                    ),
                )
                spool = exchange.spool_dir(work)
                deadline = time.monotonic() + 10
                while any(spool.glob("window-*.npz")) and time.monotonic() < deadline:
                    time.sleep(0.02)  # the sidecar ingests within its poll period (1 s)
                client.get(f"http://127.0.0.1:{scrape}/metrics")  # one Prometheus scrape per window
                client.get(base + "/v1/windows", params={"after": seq}, headers=auth)  # one collect
                seq = i + 1
                time.sleep(args.compress)
            wall = time.monotonic() - t1
            busy = _cpu_seconds(child.pid) - c1
            rss, hwm = _rss_mb(child.pid)
    finally:
        child.terminate()
        child.wait(10)
    per_window = max(0.0, busy - idle_rate * wall) / args.windows
    core = (per_window + idle_rate * args.interval) / args.interval
    return {
        "windows": args.windows,
        "wall_s": wall,
        "idle_cpu_fraction": idle_rate,
        "cpu_s_per_window": per_window,
        "extrapolated_core_fraction": core,
        "rss_start_mb": rss_start[0],
        "rss_mb": rss,
        "rss_peak_mb": hwm,
    }


def _run_sidecar_child(argv: list[str]) -> int:
    from moe_runtime.sidecar.service import EngineCheck, Sidecar, SidecarOptions
    from moe_runtime.sidecar.state import EngineLayout

    port, probes, scrape, work, layers, experts, gpus, redundant = argv
    opts = SidecarOptions(
        host="127.0.0.1",
        port=int(port),
        probe_port=int(probes),
        metrics_port=int(scrape),
        state_dir=Path(work),
        token_file=Path(work) / "token",
        layout=EngineLayout(
            num_gpus=int(gpus),
            gpus_per_node=8,
            num_redundant=int(redundant),
            num_layers=int(layers),
            num_experts=int(experts),
            top_k=8,
        ),
        identity={"instance": "bench", "role": "decode"},
        # a health check every 5 s, as in a pod (here against its own probe listener)
        engine_check=EngineCheck(f"http://127.0.0.1:{probes}/healthz"),
    )

    async def run() -> None:
        sidecar = Sidecar(opts)
        await sidecar.start()
        try:
            await asyncio.Event().wait()
        finally:
            await sidecar.stop()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run())
    return 0


# ---------------------------------------------------------------- hook


def bench_hook(args: argparse.Namespace) -> dict[str, Any]:
    layers, experts, gpus, redundant = args.layers, args.experts, args.gpus, args.redundant
    physical = experts + redundant
    rng = np.random.default_rng(1)
    buffer = rng.integers(0, 64, size=(args.buffer, layers, experts), dtype=np.int32)
    work = Path(tempfile.mkdtemp(prefix="moe-bench-hook-"))
    op_map = deepseek_global(buffer[:10].sum(axis=0), gpus, redundant)
    exchange.write_placement(exchange.placement_path(work), PlacementDoc(7, op_map, time.time()))
    shape = eplb_hook.EngineShape(layers, experts, physical, gpus, max(1, gpus // 8), 8)
    settings = eplb_hook.HookSettings(mode="operator", state_dir=work, use_planner=False)

    t0 = time.perf_counter()
    counts, passes = eplb_hook.window_from_buffer(buffer)
    reduce_s = time.perf_counter() - t0

    background: list[float] = []

    def timed(state: eplb_hook.HookState) -> float:
        start = time.perf_counter()
        eplb_hook.export_window(state, counts, passes, shape)
        decision = eplb_hook.choose_map(state, counts, shape)
        assert decision.phy2log is not None, decision.reason
        rebalance_outputs(decision.phy2log, experts)
        eplb_hook.record_applied(state, decision, decision.phy2log, hook_seconds=0.0)
        took = time.perf_counter() - start
        t0 = time.perf_counter()
        state.flush()  # the file writes run on the plugin's writer thread, after the hook returned
        background.append(time.perf_counter() - t0)
        return took

    state = eplb_hook.HookState(settings)
    cold = timed(state)  # first call parses the placement file
    warm = [timed(state) for _ in range(args.reps)]
    # a new version every rebalance: parse + validate each time
    fresh = []
    for i in range(args.reps):
        exchange.write_placement(exchange.placement_path(work), PlacementDoc(8 + i, op_map, time.time()))
        fresh.append(timed(state))
    out: dict[str, Any] = {
        "window_reduce_cpu_s": reduce_s,
        "numpy_hook_cold_s": cold,
        "numpy_hook_cached_placement_median_s": statistics.median(warm),
        "numpy_hook_new_placement_median_s": statistics.median(fresh),
        "background_writes_median_s": statistics.median(background),
    }
    out.update(_bench_planner_path(args, counts, shape))
    out.update(_bench_torch_hook(args, buffer, op_map, work))
    return out


def _bench_planner_path(
    args: argparse.Namespace, counts: IntArray, shape: eplb_hook.EngineShape
) -> dict[str, Any]:
    """No operator placement: the project's planner decides; report the hook's time around it."""
    if eplb_hook.load_planner() is None:
        return {"planner": "skipped: moe_placement planner not importable"}
    work = Path(tempfile.mkdtemp(prefix="moe-bench-planner-"))
    state = eplb_hook.HookState(eplb_hook.HookSettings(mode="operator", state_dir=work, use_planner=True))
    totals, planner = [], []
    for _ in range(max(3, args.reps // 4)):
        start = time.perf_counter()
        eplb_hook.export_window(state, counts, 1000, shape)
        decision = eplb_hook.choose_map(state, counts, shape)
        assert decision.source == "planner", (decision.reason, dict(state.errors))
        assert decision.phy2log is not None
        rebalance_outputs(decision.phy2log, shape.num_logical)
        eplb_hook.record_applied(state, decision, decision.phy2log, hook_seconds=0.0)
        totals.append(time.perf_counter() - start)
        planner.append(decision.planner_seconds)
        state.flush()
    overhead = [t - p for t, p in zip(totals, planner, strict=True)]
    return {
        "planner_median_s": statistics.median(planner),
        "planner_path_overhead_median_s": statistics.median(overhead),
    }


def _bench_torch_hook(args: argparse.Namespace, buffer: Any, op_map: IntArray, work: Path) -> dict[str, Any]:
    """The real AROUND hook with a stub original: one-pass window (adapter overhead) and full window."""
    try:
        import torch

        from moe_runtime import sglang_plugin
    except Exception as exc:
        return {"torch_hook": f"skipped: {exc}"}
    layers, experts = args.layers, args.experts
    physical = experts + args.redundant
    num_local = physical // args.gpus
    trivial = trivial_map(layers, experts, physical)
    _, l2p, cnt = rebalance_outputs(trivial, experts)
    stub = (torch.from_numpy(trivial), torch.from_numpy(l2p), torch.from_numpy(cnt))

    def original(
        tokens_per_expert: Any,
        num_physical_experts: int,
        num_local_physical_experts: int,
        num_groups: Any,
        num_nodes: int,
        algorithm: Any,
    ) -> Any:
        return stub

    def run(tokens: Any) -> float:
        sglang_plugin.reset_state(
            eplb_hook.HookState(eplb_hook.HookSettings(mode="operator", state_dir=work, use_planner=False))
        )
        times = []
        for i in range(args.reps):
            doc = PlacementDoc(1000 + i, op_map, time.time())
            exchange.write_placement(exchange.placement_path(work), doc)
            start = time.perf_counter()
            out = sglang_plugin.around_rebalance_experts(
                original, tokens, physical, num_local, 8, 4, "deepseek"
            )
            times.append(time.perf_counter() - start)
            assert out[0].shape == (layers, physical)
            assert sglang_plugin.hook_state().last["source"] == "operator"
        sglang_plugin.reset_state()
        return statistics.median(times)

    full = torch.from_numpy(buffer)
    return {
        "torch_hook_one_pass_window_s": run(full[:1].sum(dim=0, keepdim=True)),
        "torch_hook_full_window_cpu_s": run(full),
    }


def main(args: argparse.Namespace) -> int:
    logging.getLogger("httpx").setLevel(logging.WARNING)
    report: dict[str, Any] = {
        "shape": f"{args.layers} layers x {args.experts} experts, {args.gpus} GPUs, "
        f"+{args.redundant} redundant"
    }
    if not args.skip_hook:
        report["hook"] = bench_hook(args)
    if not args.skip_sidecar:
        report["sidecar"] = bench_sidecar(args)
    _print(report, args)
    return 0


def _print(report: dict[str, Any], args: argparse.Namespace) -> None:
    print(f"moe-runtime bench: {report['shape']}")
    hook = report.get("hook")
    if hook:
        ms = {k: v * 1000 for k, v in hook.items() if isinstance(v, float)}
        lines = [
            "hook (planner excluded; target < 5 ms):",
            f"  numpy core, placement file cached:   {ms['numpy_hook_cached_placement_median_s']:.2f} ms",
            f"  numpy core, new placement each time: {ms['numpy_hook_new_placement_median_s']:.2f} ms",
            f"  numpy core, first call (cold):       {ms['numpy_hook_cold_s']:.2f} ms",
        ]
        if "planner_median_s" in ms:
            lines.append(
                f"  planner path, hook without planner:  {ms['planner_path_overhead_median_s']:.2f} ms"
            )
            lines.append(f"    (the planner itself: {ms['planner_median_s']:.1f} ms, not counted)")
        else:
            lines.append(f"  planner path: {hook.get('planner')}")
        if "torch_hook_one_pass_window_s" in ms:
            lines.append(
                f"  real torch hook, 1-pass window:      {ms['torch_hook_one_pass_window_s']:.2f} ms"
            )
            lines.append(
                f"  real torch hook, {args.buffer}-pass window:   {ms['torch_hook_full_window_cpu_s']:.2f} ms"
            )
            lines.append(
                "    (the difference is summing the [passes, L, E] int32 window on CPU; in the engine"
            )
            lines.append("     the window is on the GPU, and SGLang's own algorithm sums it the same way)")
        else:
            lines.append(f"  torch adapter: {hook.get('torch_hook')}")
        lines.append(
            f"  file writes on the writer thread:    {ms['background_writes_median_s']:.2f} ms (not in the hook)"
        )
        lines.append(f"  window reduction on CPU, numpy:      {ms['window_reduce_cpu_s']:.2f} ms")
        lines.append(f"  (medians of {args.reps} runs)")
        print("\n".join(lines))
    side = report.get("sidecar")
    if side:
        rss, peak, first = side["rss_mb"], side["rss_peak_mb"], side["rss_start_mb"]
        per_window = side["cpu_s_per_window"] * 1000
        idle = f"{side['idle_cpu_fraction'] * 100:.3f}% of one core"
        if side["idle_cpu_fraction"] == 0:
            tick = 100 / os.sysconf("SC_CLK_TCK") / args.idle
            idle = f"< {tick:.2f}% of one core (no CPU tick in {args.idle:g} s)"
        print(
            "\n".join(
                [
                    f"sidecar (targets: < 2% of one core, < 150 MB), windows every {args.interval:g} s:",
                    f"  idle CPU:        {idle}",
                    f"  CPU per window:  {per_window:.1f} ms (ingest, score, 1 scrape, 1 collect)",
                    f"  extrapolated:    {side['extrapolated_core_fraction'] * 100:.3f}% of one core",
                    f"  resident memory: {rss:.1f} MB (peak {peak:.1f}, at start {first:.1f})",
                    f"  time compressed: {side['windows']} windows in {side['wall_s']:.1f} s",
                ]
            )
        )
    print(json.dumps(report, indent=2, default=float))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_sidecar":
        sys.exit(_run_sidecar_child(sys.argv[2:]))
    parser = argparse.ArgumentParser(prog="python -m moe_runtime.bench")
    add_arguments(parser)
    sys.exit(main(parser.parse_args()))
