"""Common pydantic configuration of every API object: camelCase names, unknown fields refused."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel


class APIObject(BaseModel):
    """Base of spec objects: camelCase on the wire, snake_case in Python, typos refused."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        validate_default=True,
    )

    def to_wire(self) -> dict[str, Any]:
        """The object as the apiserver stores it: camelCase keys, unset optionals left out."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


class StatusObject(APIObject):
    """Base of status objects: tolerant of fields written by newer operator versions."""

    model_config = ConfigDict(extra="ignore")


def section(factory: type[BaseModel], description: str) -> Any:
    """A sub-object that defaults to ``{}`` so the apiserver fills in its own defaults."""
    return Field(default_factory=factory, description=description, json_schema_extra={"default": {}})


def cel(rule: str, message: str, field_path: str | None = None, reason: str | None = None) -> dict[str, Any]:
    """One x-kubernetes-validations entry (a CEL rule the apiserver enforces)."""
    entry: dict[str, Any] = {"rule": rule, "message": message}
    if field_path is not None:
        entry["fieldPath"] = field_path
    if reason is not None:
        entry["reason"] = reason
    return entry


def rules(*entries: dict[str, Any]) -> ConfigDict:
    """Model config that attaches CEL rules to the object's schema."""
    return ConfigDict(json_schema_extra={"x-kubernetes-validations": list(entries)})
