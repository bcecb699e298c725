"""Boot balanced: turn the persisted placement into SGLang's ``--init-expert-location`` file.

SGLang's loader passes the JSON dict as keyword arguments to ``init_by_mapping``, so the
file may hold ``physical_to_logical_map`` and nothing else; the operator's document
(version, timestamps, ...) is therefore rewritten into a clean file in the state dir.
Freshness does not matter at boot: any valid persisted placement beats the trivial one.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from moe_contract.engine import EngineConfig
from moe_placement.document import PlacementDoc
from moe_placement.maps import PlacementError, validate_map
from moe_runtime import exchange

INIT_FILE = "init-expert-location.json"


@dataclass(frozen=True)
class InitLocation:
    path: Path | None  # None: start with SGLang's trivial placement
    version: int | None
    source: str  # file the map came from, or "trivial"
    notes: tuple[str, ...] = ()


def prepare(cfg: EngineConfig, state_dir: Path) -> InitLocation:
    """Pick the highest valid version among the sidecar's last accepted one and the mounted file; on
    a tie the pushed one, as the plugin does at a rebalance (an instance's own map is pushed under
    the same version as the pool's map in the live ConfigMap)."""
    if cfg.eplb.mode == "off":
        return InitLocation(None, None, "trivial", ("eplb.mode off: no initial placement",))
    candidates = [exchange.placement_path(state_dir)]
    if cfg.eplb.placement_file:
        candidates.append(Path(cfg.eplb.placement_file))
    notes: list[str] = []
    best: tuple[PlacementDoc, Path] | None = None
    for path in candidates:
        doc, err = exchange.CachedPlacementFile(path).load()
        if err:
            notes.append(f"ignored {err}")
            continue
        if doc is None:
            continue
        problem = fit_problem(cfg, doc)
        if problem:
            notes.append(f"ignored {path} (version {doc.version}): {problem}")
            continue
        if best is None or best[0].version < doc.version:
            best = (doc, path)
    if best is None:
        return InitLocation(None, None, "trivial", tuple(notes))
    doc, path = best
    out = state_dir / INIT_FILE
    exchange.atomic_write_json(out, {"physical_to_logical_map": doc.physical_to_logical_map.tolist()})
    return InitLocation(out, doc.version, str(path), tuple(notes))


def fit_problem(cfg: EngineConfig, doc: PlacementDoc) -> str | None:
    """Why the map cannot be this engine's placement, or None.

    The engine has E + R physical slots per layer, so E = slots - R is exact even when the
    operator did not render the model's facts.
    """
    facts = cfg.model
    redundant = cfg.eplb.num_redundant_experts
    arr = doc.physical_to_logical_map
    slots = arr.shape[-1] if arr.ndim == 2 else 0
    num_logical = facts.num_experts if facts.num_experts is not None else slots - redundant
    try:
        validate_map(
            arr,
            num_layers=facts.num_layers,
            num_logical=max(num_logical, 1),
            num_physical=num_logical + redundant,
            num_gpus=cfg.parallel.ep_size,
        )
    except PlacementError as exc:
        return str(exc)
    return None
