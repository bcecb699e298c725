"""The placement ConfigMaps: the live one every pod mounts, plus the last few versions for rollback."""

from __future__ import annotations

import json
from typing import Any

from moe_operator.api import keys as K
from moe_operator.control.history_store import KEY as HISTORY_KEY
from moe_operator.render import labels as L
from moe_operator.render.group import Owner, placement_config_name

KEEP_VERSIONS = 3


def version_name(name: str, pool: str, version: int) -> str:
    return f"{placement_config_name(name, pool)}-v{version}"


def configmaps(
    owner: Owner, pool: str, doc: dict[str, Any], provenance: dict[str, Any]
) -> list[dict[str, Any]]:
    """The versioned copy first, then the live ConfigMap (so a crash between them loses nothing)."""
    labels = {**L.pool_selector(owner.name, pool), "app.kubernetes.io/managed-by": K.MANAGED_BY}
    annotations = {
        K.PLACEMENT_VERSION: str(doc["version"]),
        K.PLACEMENT_PROVENANCE: json.dumps(provenance, sort_keys=True),
    }
    data = {"placement.json": json.dumps(doc, separators=(",", ":"))}

    def cm(cm_name: str) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": cm_name,
                "namespace": owner.namespace,
                "labels": labels,
                "annotations": annotations,
                "ownerReferences": [owner.reference()],
            },
            "data": data,
        }

    return [cm(version_name(owner.name, pool, doc["version"])), cm(placement_config_name(owner.name, pool))]


def history_name(name: str, pool: str) -> str:
    return f"{placement_config_name(name, pool)}-history"


def history_configmap(owner: Owner, pool: str, text: str) -> dict[str, Any]:
    """The pool's stored load history (history_store.encode); no pod mounts it."""
    labels = {**L.pool_selector(owner.name, pool), "app.kubernetes.io/managed-by": K.MANAGED_BY}
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": history_name(owner.name, pool),
            "namespace": owner.namespace,
            "labels": labels,
            "ownerReferences": [owner.reference()],
        },
        "data": {HISTORY_KEY: text},
    }


def expired_versions(version: int, keep: int = KEEP_VERSIONS) -> list[int]:
    """The copy that falls out of the rollback window when ``version`` is published."""
    old = version - keep
    return [old] if old >= 1 else []
