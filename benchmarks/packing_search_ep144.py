"""How much a far longer search could win at two slots per GPU (EP144), packing alone.

The bench's packing row for EP144 sits at 0.99x DeepSeek's map fitted on the same window,
against a 0.9x target. This asks whether the exchange search is what stops it: starting
from the packer's own map, simulated annealing exchanges copies between GPUs on exactly
the packer's objective (mean over the window's mean and 32 step samples of the busiest GPU;
dynamic dispatch) for ``--iterations`` tries per layer, against the packer's few dozen
rounds, and keeps the best map it saw. Every map is then scored on every step of the window, as the bench does. Also
printed, as a scale for what per-step noise alone costs: each step re-placed for itself
(greedy copies, largest paired with smallest), which no fixed map can match. Usage:

    .venv/bin/python benchmarks/packing_search_ep144.py [--seeds 101,102,103] [--windows 4] [--iterations 50000]

Stationary traffic as in the bench's packing suite; several minutes at the defaults.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from moe_placement.baseline import baseline_plan
from moe_placement.bench import packer_alone, rebalance_points, step_samples
from moe_placement.forecast import shares
from moe_placement.layout import FloatArray, IntArray, make_layout
from moe_placement.metrics import gpu_loads, imbalance
from moe_placement.regimes import SETUPS, synthetic_counts
from moe_placement.replicate import greedy_counts

SETUP = SETUPS["EP144"]
GPUS, SLOTS, WINDOW, LAYERS = SETUP.num_gpus, SETUP.slots_per_gpu, 64, 4


def anneal(phy2log: IntArray, scen: FloatArray, iterations: int, rng: np.random.Generator) -> IntArray:
    """One layer's map [P] improved on scenarios [K, E]: exchanges of one copy between two GPUs."""
    copies = np.bincount(phy2log, minlength=scen.shape[1])
    slot = phy2log.copy()
    item = (scen / copies).T[slot]  # [P, K] each slot's copy load per scenario
    load = item.reshape(GPUS, SLOTS, -1).sum(axis=1)  # [G, K]
    cost = load.max(axis=0).mean()
    best, best_cost = slot.copy(), cost
    start = cost * 0.002  # temperature: a small share of the objective, cooled linearly to zero
    for it in range(iterations):
        # mostly a GPU that is some scenario's bottleneck, sometimes any GPU
        g = (
            int(load.argmax(axis=0)[rng.integers(load.shape[1])])
            if rng.random() < 0.8
            else int(rng.integers(GPUS))
        )
        h = int(rng.integers(GPUS))
        if g == h:
            continue
        a, b = g * SLOTS + int(rng.integers(SLOTS)), h * SLOTS + int(rng.integers(SLOTS))
        on_g, on_h = set(slot[g * SLOTS : (g + 1) * SLOTS]), set(slot[h * SLOTS : (h + 1) * SLOTS])
        if slot[a] in on_h or slot[b] in on_g:  # two copies of one expert on one GPU add nothing
            continue
        delta = item[b] - item[a]
        old_g, old_h = load[g].copy(), load[h].copy()
        load[g] += delta
        load[h] -= delta
        new = load.max(axis=0).mean()
        temp = start * (1 - it / iterations)
        if new < cost or (temp > 0 and rng.random() < np.exp(-(new - cost) / temp)):
            cost = new
            slot[[a, b]] = slot[[b, a]]
            item[[a, b]] = item[[b, a]]
            if cost < best_cost:
                best, best_cost = slot.copy(), cost
        else:
            load[g], load[h] = old_g, old_h
    return best  # the best map seen: never worse on the objective than the start


def per_step_floor(window: FloatArray) -> float:
    """Mean per-step excess when every step gets its own greedy copies and optimal pairing."""
    steps = window.reshape(-1, window.shape[-1])
    copies = greedy_counts(steps, GPUS * SLOTS, GPUS * SLOTS)  # DeepSeek's rule, per step
    out = []
    for step, cnt in zip(steps, copies, strict=True):
        items = np.sort(np.repeat(step / cnt, cnt))[::-1]
        out.append((items[:GPUS] + items[::-1][:GPUS]).max() / (step.sum() / GPUS) - 1)
    return float(np.mean(out))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="101,102,103")
    parser.add_argument("--windows", type=int, default=4, help="windows per seed")
    parser.add_argument("--iterations", type=int, default=50000, help="annealing tries per layer")
    args = parser.parse_args()
    layout = make_layout(LAYERS, SETUP.num_experts, **SETUP.shape())
    rows: list[list[float]] = []
    started = time.perf_counter()
    for seed in (int(s) for s in args.seeds.split(",")):
        counts = synthetic_counts(
            SETUP, "stationary", window=WINDOW, steps=16 * WINDOW, layers=LAYERS, seed=seed
        )
        for t in rebalance_points(counts.shape[0], WINDOW)[: args.windows]:
            window, samples = counts[t : t + WINDOW], step_samples(counts, t, WINDOW)
            ours = packer_alone(window, samples, layout, "dynamic")
            scen = np.concatenate([shares(window.sum(axis=0)[None])[0], shares(samples)[0]])  # [K, L, E]
            rng = np.random.default_rng(seed * 1000 + t)
            annealed = np.stack(
                [anneal(ours[layer], scen[:, layer], args.iterations, rng) for layer in range(LAYERS)]
            )
            maps = (baseline_plan(window.sum(axis=0), **SETUP.shape()), ours, annealed)
            rows.append([float(imbalance(gpu_loads(m, window, GPUS)).mean() - 1) for m in maps])
            rows[-1].append(per_step_floor(window))
            base, packed, searched, floor = rows[-1]
            print(
                f"seed {seed} step {t}: DeepSeek {base:.4f}, packer {packed / base:.3f}x, "
                f"annealed {searched / base:.3f}x, each step re-placed {floor / base:.2f}x "
                f"({time.perf_counter() - started:.0f} s)",
                flush=True,
            )
    base, packed, searched, floor = np.mean(rows, axis=0)
    print(
        f"EP144 packing alone over {len(rows)} windows x {LAYERS} layers: DeepSeek fitted {base:.4f}; "
        f"packer {packed:.4f} ({packed / base:.3f}x); annealed, {args.iterations} tries per layer, "
        f"{searched:.4f} ({searched / base:.3f}x); each step re-placed for itself {floor:.4f} ({floor / base:.2f}x)"
    )


if __name__ == "__main__":
    main()
