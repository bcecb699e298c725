"""The SGLang metric catalog (policies/prometheus/sglang-0.5.23.metrics.yaml) against the real wheel.

tools/sglang_metrics.py builds SGLang's own collectors in forked processes, as the engine
does, and reads them back through SGLang's own /metrics route; the committed catalog must be
exactly what that yields with the installed sglang. The alert rules, their promtool series and
the replay engine's SGLang metrics are checked against the catalog (tests/policies).
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from rt_helpers import REPO, require_sglang

pytestmark = pytest.mark.runtime


def test_catalog_matches_the_installed_wheel() -> None:
    require_sglang()
    import sglang

    assert sglang.__version__ == "0.5.23"
    proc = subprocess.run(
        [sys.executable, "-W", "ignore", str(REPO / "tools" / "sglang_metrics.py"), "check"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
