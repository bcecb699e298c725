"""One derived setting: an engine flag or an environment variable, with its rule and source."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class Setting:
    """``kind`` arg: ``--flag value`` (value None: a switch); env: NAME=value."""

    kind: Literal["arg", "env"]
    name: str
    value: str | None
    rule: str  # why, in one sentence
    source: str  # file:function of SGLang/DeepEP, or a public reference deployment

    def argv(self) -> list[str]:
        if self.kind != "arg":
            return []
        return [self.name] if self.value is None else [self.name, self.value]
