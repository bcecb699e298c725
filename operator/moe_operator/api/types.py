"""Field types shared by the spec: Kubernetes quantities, durations, label keys, embedded objects.

Each type carries the structural OpenAPI schema the apiserver needs (int-or-string,
preserve-unknown-fields) so that the CRD generator never has to guess, and a parser so
the rest of the operator works with plain numbers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    StringConstraints,
    WithJsonSchema,
)
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, PydanticCustomError, core_schema

from .base import cel

# The apiserver's own resource.Quantity grammar (as emitted by controller-gen).
QUANTITY_PATTERN = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
    r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
DURATION_PATTERN = r"^([0-9]+(ms|s|m|h))+$"
PARAM_COUNT_PATTERN = r"^[0-9]+(\.[0-9]+)?[KMBT]?$"
# A qualified Kubernetes label key: optional DNS-subdomain prefix, then a name.
LABEL_KEY_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?(\.[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
"""A Kubernetes qualified name (label key): optional DNS-subdomain prefix and '/', a name part of at
most 63 characters; the prefix's 253-character limit is checked by _qualified_name."""
LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$"
RESOURCE_NAME_PATTERN = (
    r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?(\.[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)*/"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
"""An extended resource name (nvidia.com/gpu, rdma/ib): always domain-qualified."""


def _qualified_name(key: str) -> str:
    prefix = key.rpartition("/")[0]
    if len(prefix) > 253:
        raise ValueError(f"the prefix of {key[:40]}... is longer than 253 characters")
    return key


_QUANTITY_SUFFIX: dict[str, Decimal] = {
    "": Decimal(1),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal(10**3),
    "M": Decimal(10**6),
    "G": Decimal(10**9),
    "T": Decimal(10**12),
    "P": Decimal(10**15),
    "E": Decimal(10**18),
    "Ki": Decimal(2**10),
    "Mi": Decimal(2**20),
    "Gi": Decimal(2**30),
    "Ti": Decimal(2**40),
    "Pi": Decimal(2**50),
    "Ei": Decimal(2**60),
}
_QUANTITY_RE = re.compile(
    r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))([eE][+-]?[0-9.]+|[KMGTPE]i|[numkMGTPE])?$"
)
_DURATION_PART_RE = re.compile(r"([0-9]+)(ms|s|m|h)")
_DURATION_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_COUNT_SUFFIX = {"": 1, "K": 10**3, "M": 10**6, "B": 10**9, "T": 10**12}

INT_OR_STRING_QUANTITY: dict[str, Any] = {
    "anyOf": [{"type": "integer"}, {"type": "string"}],
    "pattern": QUANTITY_PATTERN,
    "x-kubernetes-int-or-string": True,
}
INT_OR_STRING_COUNT: dict[str, Any] = {
    "anyOf": [{"type": "integer"}, {"type": "string"}],
    "pattern": PARAM_COUNT_PATTERN,
    "x-kubernetes-int-or-string": True,
}
EMBEDDED_OBJECT: dict[str, Any] = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}

Quantity = Annotated[
    int | Annotated[str, StringConstraints(pattern=QUANTITY_PATTERN, max_length=64)],
    WithJsonSchema(INT_OR_STRING_QUANTITY),
]
"""A Kubernetes quantity such as ``80Gi`` or a plain number of bytes."""

ParamCount = Annotated[
    int | Annotated[str, StringConstraints(pattern=PARAM_COUNT_PATTERN, max_length=32)],
    WithJsonSchema(INT_OR_STRING_COUNT),
]
"""A parameter count such as ``671B`` (K, M, B, T are powers of 1000) or a plain integer."""

Duration = Annotated[str, StringConstraints(pattern=DURATION_PATTERN, max_length=32)]
"""A Go-style duration made of ms, s, m and h parts, such as ``5m`` or ``1h30m``."""


@dataclass(frozen=True)
class DurationRange:
    """Bounds of a Duration field: ``Annotated[Duration, DurationRange("30s", "24h")]``.

    Refused outside by pydantic (the webhook, the reconciler, `crds validate`) and by a CEL rule
    in the CRD (the apiserver, also with the webhook down), in the same words: "must be a
    duration from 30s to 24h: set one in that range".
    """

    minimum: str
    maximum: str

    @property
    def message(self) -> str:
        return f"must be a duration from {self.minimum} to {self.maximum}: set one in that range"

    def rule(self) -> dict[str, Any]:
        """The CEL rule; the pattern guard keeps duration() from failing on what the schema refuses."""
        return cel(
            f"!self.matches('{DURATION_PATTERN}') || (duration(self) >= duration('{self.minimum}') "
            f"&& duration(self) <= duration('{self.maximum}'))",
            self.message,
        )

    def _check(self, value: str) -> str:
        if not parse_duration(self.minimum) <= parse_duration(value) <= parse_duration(self.maximum):
            raise PydanticCustomError("duration_range", self.message + " (got {value})", {"value": value})
        return value

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        return core_schema.no_info_after_validator_function(self._check, handler(source))

    def __get_pydantic_json_schema__(
        self, schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        json_schema = handler(schema)
        json_schema["x-kubernetes-validations"] = [
            *json_schema.get("x-kubernetes-validations", []),
            self.rule(),
        ]
        return json_schema


LabelKey = Annotated[
    str, StringConstraints(pattern=LABEL_KEY_PATTERN, max_length=317), AfterValidator(_qualified_name)
]
LabelValue = Annotated[str, StringConstraints(pattern=LABEL_VALUE_PATTERN, max_length=63)]
ResourceName = Annotated[str, StringConstraints(pattern=RESOURCE_NAME_PATTERN, max_length=317)]

EmbeddedObject = Annotated[dict[str, Any], WithJsonSchema(EMBEDDED_OBJECT)]
"""A Kubernetes object the operator passes through unchanged (volume source, toleration...)."""


def parse_quantity(value: int | str) -> Decimal:
    """Return the number a Kubernetes quantity stands for (``80Gi`` -> 85899345920)."""
    if isinstance(value, int):
        return Decimal(value)
    match = _QUANTITY_RE.match(value.strip())
    if match is None:
        raise ValueError(f"not a Kubernetes quantity: {value!r}")
    number, suffix = match.group(1), match.group(2) or ""
    if suffix[:1] in ("e", "E"):
        return Decimal(number) * (Decimal(10) ** Decimal(suffix[1:]))
    return Decimal(number) * _QUANTITY_SUFFIX[suffix]


def parse_bytes(value: int | str) -> int:
    """Return a quantity of bytes as a whole number of bytes (rounded down)."""
    return int(parse_quantity(value))


def parse_duration(value: str) -> float:
    """Return the seconds in a Go-style duration (``1h30m`` -> 5400.0)."""
    text = value.strip()
    if not re.fullmatch(DURATION_PATTERN, text):
        raise ValueError(f"not a duration: {value!r}")
    return sum(int(n) * _DURATION_SECONDS[unit] for n, unit in _DURATION_PART_RE.findall(text))


def parse_count(value: int | str) -> int:
    """Return a parameter count as an integer (``671B`` -> 671000000000)."""
    if isinstance(value, int):
        return value
    text = value.strip()
    if not re.fullmatch(PARAM_COUNT_PATTERN, text):
        raise ValueError(f"not a parameter count: {value!r}")
    suffix = text[-1] if text[-1] in _COUNT_SUFFIX else ""
    number = text[: len(text) - len(suffix)]
    return int(Decimal(number) * _COUNT_SUFFIX[suffix])
