"""Placement history and rollback over the kept versioned ConfigMaps (pure; moe_operator.cli.placement does the I/O).

A rollback never rewrites history: it publishes the chosen old map as a new version whose
provenance says "rollback of vN", and by default pauses automatic placement on the live
ConfigMap, so the control loop does not plan straight over it. The loop keeps measuring
and reports what it would do; ``moe-operator placement resume`` clears the pause.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np

from moe_operator.api import keys as K
from moe_operator.control.publish import configmaps, expired_versions, version_name
from moe_operator.render.group import Owner, placement_config_name
from moe_placement import document
from moe_placement.metrics import moved_slots

PLACEMENT_KEY = "placement.json"


@dataclass(frozen=True)
class Entry:
    version: int
    generated_at: str
    provenance: dict[str, Any]
    phy2log: np.ndarray
    live: bool  # the version every pod mounts now


def _doc(cm: dict[str, Any]) -> dict[str, Any] | None:
    raw = (cm.get("data") or {}).get(PLACEMENT_KEY)
    try:
        doc = json.loads(raw) if raw else None
    except ValueError:
        return None
    return doc if isinstance(doc, dict) and "physicalToLogicalMap" in doc else None


def history(configmaps_: list[dict[str, Any]], name: str, pool: str) -> list[Entry]:
    """The kept versions of a pool, oldest first; the live one is marked (it is also a kept copy)."""
    live_name = placement_config_name(name, pool)
    live_version = None
    entries: dict[int, Entry] = {}
    for cm in configmaps_:
        meta = cm.get("metadata") or {}
        doc = _doc(cm)
        if doc is None:
            continue
        version = int(doc.get("version") or 0)
        if meta.get("name") == live_name:
            live_version = version
            continue
        if meta.get("name") != version_name(name, pool, version):
            continue  # not ours (or renamed by hand): never roll back to it
        try:
            provenance = json.loads((meta.get("annotations") or {}).get(K.PLACEMENT_PROVENANCE) or "{}")
        except ValueError:
            provenance = {}
        arr = np.asarray(doc["physicalToLogicalMap"], dtype=np.int64)
        entries[version] = Entry(version, str(doc.get("generatedAt") or ""), provenance, arr, False)
    return [
        Entry(e.version, e.generated_at, e.provenance, e.phy2log, e.version == live_version)
        for _, e in sorted(entries.items())
    ]


def pick(entries: list[Entry], to_version: int | None) -> Entry:
    """The version to restore: the one asked for, else the newest older than the live one."""
    live = next((e for e in entries if e.live), None)
    if to_version is not None:
        for e in entries:
            if e.version == to_version:
                if e.live:
                    raise ValueError(f"v{to_version} is already the live placement")
                return e
        kept = ", ".join(f"v{e.version}" for e in entries) or "none"
        raise ValueError(f"v{to_version} is not kept (kept: {kept})")
    older = [e for e in entries if live is None or e.version < live.version]
    if not older:
        raise ValueError("no older placement version is kept to roll back to")
    return older[-1]


def rollback(
    owner: Owner,
    pool: str,
    entries: list[Entry],
    target: Entry,
    now: datetime,
    pause: bool = True,
) -> tuple[list[dict[str, Any]], list[int]]:
    """The ConfigMaps to apply (new version copy, then live) and the versions to delete."""
    newest = max(e.version for e in entries)
    version = newest + 1
    live = next((e for e in entries if e.live), None)
    doc = document.render(version, target.phy2log, now)
    provenance: dict[str, Any] = {
        "reason": f"rollback of v{target.version}",
        "rollbackOf": target.version,
        "by": "moe-operator placement rollback",
    }
    if live is not None:
        provenance["movedExperts"] = moved_slots(live.phy2log, target.phy2log)
    objs = configmaps(owner, pool, doc, provenance)
    if pause:
        live_meta = objs[1]["metadata"]
        live_meta["annotations"] = {
            **live_meta["annotations"],
            K.PLACEMENT_PAUSED: f"rollback of v{target.version} to v{version}",
        }
    return objs, expired_versions(version)


def describe(e: Entry) -> str:
    """One line of `moe-operator placement history`."""
    p = e.provenance
    if "rollbackOf" in p:
        what = str(p.get("reason") or f"rollback of v{p['rollbackOf']}")
    elif "predictedBalancedness" in p:
        what = (
            f"measured {p.get('measuredBalancedness')} -> predicted {p.get('predictedBalancedness')}, "
            f"{p.get('movedExperts')} slots moved, {p.get('historyBuckets', '?')} load buckets"
        )
    else:
        what = "(no provenance)"
    return f"{'*' if e.live else ' '} v{e.version:<4} {e.generated_at:<20} {what}"
