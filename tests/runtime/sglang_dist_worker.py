"""One rank of the multi-process plugin test: gloo process group + SGLang's real init_by_eplb.

argv: rank world port plan.json out.json. Each rank has its OWN state dir and placement
file (as the pods of one engine instance see different files); every scenario must still
end with the same map on every rank, chosen by rank 0.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))


def main() -> None:
    rank, world, port = (int(x) for x in sys.argv[1:4])
    plan = json.loads(Path(sys.argv[4]).read_text())
    out_path = Path(sys.argv[5])
    state_dir = Path(plan["state_root"]) / f"rank{rank}"
    state_dir.mkdir(parents=True, exist_ok=True)
    os.environ["MOE_RUNTIME_STATE_DIR"] = str(state_dir)
    os.environ["MOE_EPLB_PLANNER"] = "off"
    os.environ["MOE_PLACEMENT_MAX_AGE_SECONDS"] = "600"

    import numpy as np
    import torch
    import torch.distributed as dist
    from sglang_ctx import expert_location_context, plugin_hook_installed

    from moe_runtime import exchange

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    shape = plan["shape"]
    layers, experts, gpus, redundant = shape["layers"], shape["experts"], shape["gpus"], shape["redundant"]
    results = {}
    with plugin_hook_installed() as original:
        from sglang.srt.eplb.eplb_algorithms import EplbAlgorithm

        for name, scenario in plan["scenarios"].items():
            placement = scenario.get(str(rank))
            target = exchange.placement_path(state_dir)
            if placement is None:
                target.unlink(missing_ok=True)
            else:
                doc = exchange.PlacementDoc(
                    placement["version"], np.asarray(placement["map"]), time.time() - placement.get("age", 0)
                )
                exchange.write_placement(target, doc)
            g = torch.Generator().manual_seed(scenario["window_seed"])  # same all-reduced window everywhere
            window = torch.randint(0, 100, (16, layers, experts), generator=g, dtype=torch.int32)
            dist.barrier()
            with expert_location_context(
                num_layers=layers,
                num_experts=experts,
                ep_size=gpus,
                num_redundant=redundant,
                dispatch="static",
            ) as el:
                meta = el.ExpertLocationMetadata.init_by_eplb(None, window)
            vanilla = original(
                window, experts + redundant, (experts + redundant) // gpus, None, 1, EplbAlgorithm.deepseek
            )
            results[name] = {
                "phy2log": meta.physical_to_logical_map.tolist(),
                "log2phy": meta.logical_to_all_physical_map.tolist(),
                "dispatch_row": meta.logical_to_rank_dispatch_physical_map.tolist(),
                "vanilla": vanilla[0].tolist(),
            }
    out_path.write_text(json.dumps(results))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
