"""Per-instance runtime credentials (issue 15, item 5): a token opens one instance's runtime only.

An engine pod mounts only ``digests.json`` (the SHA-256 of each instance's token), so what a
compromised engine pod holds opens no runtime, its own included; the operator derives each
instance's token from the deployment's key. Checked on the pure functions and on a real runtime
process (`moe-runtime replay`, the sidecar `launch` runs) whose token directory is what the pod
mounts.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from test_runtime_listener import replay_process

from local_ports import free_ports
from moe_contract.auth import (
    DIGESTS_FILE,
    digests_document,
    instance_token,
    parse_digests,
    token_digest,
    token_matches,
)

KEY = bytes(range(32))
NAMES = [f"moe-{pool}-{i}" for pool in ("prefill", "decode") for i in range(3)]


def test_tokens_differ_per_instance_and_key() -> None:
    tokens = {instance_token(KEY, n) for n in NAMES}
    assert len(tokens) == len(NAMES)
    assert instance_token(KEY, "moe-decode-0") != instance_token(bytes(32), "moe-decode-0")
    with pytest.raises(ValueError, match="16 bytes"):
        instance_token(b"short", "moe-decode-0")


def test_digests_open_exactly_their_own_instance() -> None:
    digests = parse_digests(digests_document(KEY, NAMES))
    assert sorted(digests) == sorted(NAMES)
    for name in NAMES:
        assert token_matches(digests, name, instance_token(KEY, name))
        others = [n for n in NAMES if n != name]
        assert not any(token_matches(digests, name, instance_token(KEY, o)) for o in others)
    assert not token_matches(digests, "moe-decode-9", instance_token(KEY, "moe-decode-9"))
    # What a pod holds is a digest of a token, not the token: presenting it opens nothing.
    assert not token_matches(digests, "moe-decode-0", digests["moe-decode-0"])
    assert KEY.hex() not in digests_document(KEY, NAMES)


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        "[]",
        '{"digests": []}',
        json.dumps({"digests": {"UPPER": "0" * 64}}),
        json.dumps({"digests": {"moe-decode-0": "xyz"}}),
        json.dumps({"digests": {f"i-{n}": "0" * 64 for n in range(2000)}}),
        "{" * 300_000,
    ],
)
def test_bad_digest_files_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_digests(text)


@pytest.fixture
def pod_runtime(tmp_path: Path) -> Iterator[int]:
    """A runtime for instance moe-decode-1 whose token directory holds only digests.json."""
    tokens = tmp_path / "token"
    tokens.mkdir()
    (tokens / DIGESTS_FILE).write_text(digests_document(KEY, NAMES))
    api, probes, scrape, engine = free_ports(4)
    cmd = [
        sys.executable, "-m", "moe_runtime.cli", "replay", "--model", "tiny", "--instance", "moe-decode-1",
        "--layers", "2", "--experts", "8", "--gpus", "2", "--gpus-per-node", "2", "--redundant", "2",
        "--rebalance-iterations", "20", "--pass-interval", "0.01", "--port", str(api),
        "--probe-port", str(probes), "--metrics-port", str(scrape), "--engine-port", str(engine),
        "--state-dir", str(tmp_path / "state"), "--token-file", str(tokens / "token"),
        "--reads", "token", "--planner", "off", "--poll-interval", "0.1",
    ]  # fmt: skip
    with replay_process(cmd, probes):
        yield api


def test_a_runtime_accepts_only_its_own_instances_token(pod_runtime: int) -> None:
    url = f"http://127.0.0.1:{pod_runtime}/v1/windows"

    def status(token: str | None) -> int:
        headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
        return httpx.get(url, headers=headers, timeout=5).status_code

    assert status(instance_token(KEY, "moe-decode-1")) == 200
    assert status(instance_token(KEY, "moe-decode-0")) == 401, "another instance's token opened it"
    assert status(instance_token(KEY, "moe-prefill-1")) == 401
    assert status(token_digest(instance_token(KEY, "moe-decode-1"))) == 401, "the mounted digest opened it"
    assert status(None) == 401
    resp = httpx.put(
        f"http://127.0.0.1:{pod_runtime}/v1/placement",
        json={"version": 5},
        headers={"Authorization": f"Bearer {instance_token(KEY, 'moe-decode-0')}"},
        timeout=5,
    )
    assert resp.status_code == 401, resp.text
