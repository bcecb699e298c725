"""The validating webhook: rules that need the model catalog or arithmetic (CEL covers the rest).

Failure policy is Ignore, deliberately: when the operator is down, users can still apply
and delete MoEDeployments (the CRD's schema and CEL rules still hold), and the reconciler
re-runs the same rules before acting, so an invalid spec that slipped through is reported
as InvalidSpec and changes nothing that runs. Deletes are never sent to the webhook.
"""

from __future__ import annotations

from typing import Any

import kopf

from moe_operator.handlers.state import operator_of
from moe_operator.validation import validate, warnings

GROUP = "moe.inference.dev"
RESOURCE = "moedeployments"


@kopf.on.validate(
    GROUP, RESOURCE, id="validate", operations=["CREATE", "UPDATE"], ignore_failures=True, side_effects=False
)
async def validate_moedeployment(spec: kopf.Spec, memo: kopf.Memo, **kwargs: Any) -> None:
    """Runs on the event loop (it is pure and takes well under a millisecond): a sync handler
    would queue behind reconciles in kopf's thread pool and slow every create and update.

    The platform's policy (what tenants may put into pods) and the object's namespace decide the
    tenant rules, exactly as the reconciler's check_spec decides them.
    """
    old = kwargs.get("old")
    old_spec = dict(old.get("spec") or {}) if kwargs.get("operation") == "UPDATE" and old else None
    meta = kwargs.get("meta") or {}
    namespace = kwargs.get("namespace") or meta.get("namespace")
    problems = validate(dict(spec), old_spec, operator_of(memo).platform, namespace)
    if problems:
        raise kopf.AdmissionError("; ".join(str(p) for p in problems), code=422)
    sink = kwargs.get("warnings")
    if isinstance(sink, list):  # kopf returns these as the admission response's warnings
        sink.extend(warnings(dict(spec), old_spec))
