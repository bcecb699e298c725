"""One reason admission refuses a spec: where, and what to change."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    """A refused field: JSON path (spec.decode.nodesPerReplica) and a message saying what to change."""

    field: str
    message: str

    def __str__(self) -> str:
        return self.message if self.message.startswith(self.field) else f"{self.field}: {self.message}"
