"""String types the spec's fields share (bounded, so the CRD states every length)."""

from __future__ import annotations

from typing import Annotated

from pydantic import StringConstraints

Arg = Annotated[str, StringConstraints(max_length=1024)]
Name = Annotated[str, StringConstraints(min_length=1, max_length=253)]
IBDevice = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.:-]+$", max_length=64)]
