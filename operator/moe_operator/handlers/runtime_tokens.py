"""Each leader's instance token, for calls to its runtime (the control loop's, the start-up probe's)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from moe_contract.auth import instance_token
from moe_operator.handlers.state import OperatorState
from moe_operator.reconcile.token import instance_of, key_of
from moe_operator.render.group import Owner, token_secret_name


def leader_tokens(op: OperatorState, owner: Owner, leaders: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """Pod IP -> its instance's token, derived from the deployment's key (its Secret is created by the
    reconciler); when the key is gone or not the deployment's own, the reconciler is told to look
    again (and recreate it), and no runtime is called with a token."""
    secret = op.kube.get(f"/api/v1/namespaces/{owner.namespace}/secrets/{token_secret_name(owner.name)}")
    key = key_of(secret, owner.uid)
    if key is None:
        op.deployment(owner.uid).token_present = False
        return {}
    return {p["ip"]: instance_token(key, instance_of(p, owner.name)) for p in leaders}
