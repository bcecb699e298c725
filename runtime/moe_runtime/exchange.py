"""Files through which the engine's plugin and the sidecar talk, inside one pod.

Why files and not a socket: the plugin runs inside SGLang's scheduler process at the
moment of a rebalance and must never block on, or fail because of, the sidecar. Every
write is atomic (temp file + rename), so a reader sees a whole document or none; the
sidecar may be down, slow or restarting and the engine does not notice.

Layout of the state directory (``MOE_RUNTIME_STATE_DIR``, an emptyDir in the pod):

- ``spool/window-*.npz``   per-expert counts of one rebalance window (plugin -> sidecar)
- ``placement.npz``        the operator's placement accepted by the sidecar (sidecar -> plugin)
- ``applied.npz``          the map the engine applied last, and where it came from (plugin -> sidecar)
- ``plugin-status.json``   the plugin's cumulative decision and error counters (plugin -> sidecar)
- ``init-expert-location.json``  the launcher's ``--init-expert-location`` file
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import stat
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np
import numpy.typing as npt

from moe_placement import document
from moe_placement.document import PlacementDoc
from moe_placement.maps import IntArray

STATE_DIR_ENV = "MOE_RUNTIME_STATE_DIR"
DEFAULT_STATE_DIR = "/tmp/moe-runtime"
StepArray = npt.NDArray[np.int32]  # single passes' counts [k, L, E]
SPOOL_LIMIT = 32  # pending windows kept when nobody consumes them

# plugin-status.json's counters, which the sidecar re-exports. Where the plugin failed (typed, so
# every stage it counts is one the sidecar exports):
ErrorStage = Literal["window", "steps", "export", "placement", "planner", "decide", "broadcast", "status"]
ERROR_STAGES: tuple[ErrorStage, ...] = get_args(ErrorStage)
# Where the map the engine applied came from (the plugin's decisions):
DecisionSource = Literal["operator", "planner", "original"]
DECISION_SOURCES: tuple[DecisionSource, ...] = get_args(DecisionSource)
# Exported windows by their step samples: "present"; "missing" (passes routed tokens, but their
# time order was unknown or unreadable, so the operator plans this instance on sums); "idle" (none did).
WindowSamples = Literal["present", "missing", "idle"]
WINDOW_SAMPLES: tuple[WindowSamples, ...] = get_args(WindowSamples)


def routed_passes(buffer: npt.ArrayLike) -> npt.NDArray[np.bool_]:
    """Which passes of a [passes, L, E] count buffer routed tokens: counts are >= 0, so those
    whose largest count is positive (an idle pass leaves its row zero)."""
    arr = np.asarray(buffer)
    rows = arr.reshape(arr.shape[0], int(np.prod(arr.shape[1:])))  # not -1: a buffer may be empty
    out: npt.NDArray[np.bool_] = rows.max(axis=1, initial=0) > 0
    return out


def state_dir(explicit: str | os.PathLike[str] | None = None) -> Path:
    return Path(explicit or os.environ.get(STATE_DIR_ENV) or DEFAULT_STATE_DIR)


def spool_dir(base: Path) -> Path:
    return base / "spool"


def placement_path(base: Path) -> Path:
    return base / "placement.npz"


def applied_path(base: Path) -> Path:
    return base / "applied.npz"


def plugin_status_path(base: Path) -> Path:
    return base / "plugin-status.json"


def atomic_write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def atomic_write_json(path: Path, doc: Any) -> None:
    atomic_write_bytes(path, json.dumps(doc, separators=(",", ":")).encode())


FileKey = tuple[int, int, int, int]


def file_key(path: Path) -> FileKey | None:
    """What tells a reader a file changed since it last read it, without reading it; None when
    absent. The writers here replace files by rename, which sets the new version's change time;
    with the inode and size this catches a same-size rewrite that mtime and size alone miss when
    a writer sets mtime back. Two versions of one size renamed within one timestamp tick (coarse
    clocks before Linux 6.13) onto a reused inode still read as one until the next write; the
    plugin rewrites its files at every rebalance."""
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size)


STATUS_MAX_BYTES = 64 * 1024  # the plugin writes under 2 KiB
NPZ_MAX_BYTES = 64 * 1024 * 1024  # a window with step samples at DeepSeek-V3 shapes is ~2 MB
_COUNT_MAX = 2**53  # counters past this are not exact as floats


def read_regular(path: Path, limit: int) -> bytes:
    """A regular file's bytes, at most ``limit`` of them; OSError otherwise.

    The state directory is shared with the engine container, so what lies there is input: a FIFO
    in a file's place would block an ordinary open() (and the sidecar's one worker thread with it)
    forever, a device would never end. Opened non-blocking and checked with fstat before reading."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(f"{path}: not a regular file")
        if st.st_size > limit:
            raise OSError(f"{path}: {st.st_size} bytes, more than {limit}")
        raw = f.read(limit + 1)
    if len(raw) > limit:
        raise OSError(f"{path}: more than {limit} bytes")
    return raw


@contextlib.contextmanager
def load_npz(path: Path, limit: int = NPZ_MAX_BYTES) -> Iterator[Any]:
    """``np.load`` of a regular file of at most ``limit`` bytes that holds at most ``limit``
    bytes of arrays (np.savez does not compress; a compressed member could inflate far beyond
    its file). OSError or ValueError otherwise."""
    with np.load(io.BytesIO(read_regular(path, limit)), allow_pickle=False) as data:
        if sum(info.file_size for info in data.zip.infolist()) > limit:
            raise ValueError(f"{path}: its arrays take more than {limit} bytes")
        yield data


def read_plugin_status(path: Path) -> dict[str, Any] | None:
    """plugin-status.json as a reader may trust it; None when absent, not a regular file, larger
    than STATUS_MAX_BYTES, unreadable, or not as the plugin writes it (``plugin_status_of``)."""
    try:
        raw = read_regular(path, STATUS_MAX_BYTES)
    except OSError:
        return None
    try:
        doc = json.loads(raw, parse_constant=_no_constant)
    except (ValueError, RecursionError):  # RecursionError: nesting deeper than the parser's stack
        return None
    return plugin_status_of(doc)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number")


def plugin_status_of(doc: Any) -> dict[str, Any] | None:
    """The known fields of a plugin status document, checked; None when any is malformed.

    It is written by the engine process in a tenant's pod, so it is input like any other from
    there. A malformed document is refused whole and the reader keeps the one it had: reading
    one bad counter as 0 and then the good value again would look to Prometheus like a counter
    reset, and ``increase()`` would count the whole value twice."""
    if not isinstance(doc, dict):
        return None
    out: dict[str, Any] = {}
    for group, names in (
        ("decisions", DECISION_SOURCES),
        ("errors", ERROR_STAGES),
        ("windows", WINDOW_SAMPLES),
    ):
        table = doc.get(group, {})
        if not isinstance(table, dict) or not all(_is_count(table.get(n, 0)) for n in names):
            return None
        out[group] = {n: int(table[n]) for n in names if n in table}
    last = doc.get("last", {})
    if not isinstance(last, dict):
        return None
    kept: dict[str, Any] = {}
    for key in ("at", "hook_seconds", "planner_seconds"):
        value = last.get(key)
        if value is not None and not _is_seconds(value):
            return None
        kept[key] = value
    source, version, reason = last.get("source"), last.get("version"), last.get("reason")
    if source not in DECISION_SOURCES:  # e.g. a newer plugin's: dropped, its counters still read
        source = None
    if version is not None and not _is_count(version):
        return None
    if reason is not None and not isinstance(reason, str):
        return None
    kept.update(source=source, version=version, reason=None if reason is None else reason[:500])
    out["last"] = {k: v for k, v in kept.items() if v is not None}
    for key, check in (("pid", _is_count), ("dropped_writes", _is_count), ("started_at", _is_seconds)):
        if key in doc:
            if not check(doc[key]):
                return None
            out[key] = doc[key]
    return out


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= _COUNT_MAX


def _is_seconds(value: Any) -> bool:
    """A finite non-negative number (a duration or a Unix time); huge ints too large for a float are not."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return _is_count(value) if isinstance(value, int) else math.isfinite(value) and value >= 0


def read_json(path: Path) -> Any | None:
    """The document, or None when absent or unreadable (a reader never raises on I/O)."""
    try:
        return json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError):
        return None


def _npz_bytes(arrays: dict[str, Any], meta: dict[str, Any]) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays, meta=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8))
    return buf.getvalue()


# ---------------------------------------------------------------- placement documents
# (the document format itself is moe_placement.document, shared with the operator)


def write_placement(path: Path, doc: PlacementDoc, extra: dict[str, Any] | None = None) -> None:
    """Binary placement document: the plugin reads it inside a rebalance (JSON would cost ms)."""
    meta = {
        **doc.extra,
        **(extra or {}),
        "version": doc.version,
        "generated_at": doc.generated_at,
        "source": doc.source,
    }
    arrays = {"physical_to_logical_map": np.ascontiguousarray(doc.physical_to_logical_map, dtype=np.int64)}
    atomic_write_bytes(path, _npz_bytes(arrays, meta))


def load_placement(path: Path) -> PlacementDoc:
    """A placement document from ``.npz`` (the sidecar's) or JSON (the operator's ConfigMap)."""
    if path.suffix == ".npz":
        try:
            with load_npz(path) as data:
                arr = np.asarray(data["physical_to_logical_map"])
                meta = json.loads(bytes(data["meta"]).decode())
        except KeyError as exc:
            raise ValueError(f"missing {exc}") from exc
        return document.parse({**meta, "physical_to_logical_map": arr})
    return document.parse(json.loads(path.read_bytes()))


class CachedPlacementFile:
    """Re-parses a placement file only when its mtime or size changed (cheap per rebalance)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._key: FileKey | None = None
        self._doc: PlacementDoc | None = None
        self._error: str | None = None

    def load(self) -> tuple[PlacementDoc | None, str | None]:
        """(document, None), (None, error) or (None, None) when the file is absent."""
        key = file_key(self.path)
        if key is None:
            self._key, self._doc, self._error = None, None, None
            return None, None
        if key != self._key:
            self._key = key
            try:
                self._doc, self._error = load_placement(self.path), None
            except (OSError, ValueError) as exc:
                self._doc, self._error = None, f"{self.path}: {exc}"
        return self._doc, self._error


def write_applied(base: Path, phy2log: IntArray, meta: dict[str, Any]) -> None:
    """Binary, because the plugin writes it inside the engine's rebalance (JSON of 17k ints is ~ms)."""
    atomic_write_bytes(
        applied_path(base),
        _npz_bytes({"physical_to_logical_map": np.ascontiguousarray(phy2log, dtype=np.int64)}, meta),
    )


def read_applied(base: Path) -> tuple[IntArray, dict[str, Any]] | None:
    try:
        with load_npz(applied_path(base)) as data:
            arr = np.asarray(data["physical_to_logical_map"], dtype=np.int64)
            meta = json.loads(bytes(data["meta"]).decode())
    except (OSError, ValueError, KeyError):
        return None
    return arr, meta if isinstance(meta, dict) else {}


# ---------------------------------------------------------------- load windows


@dataclass(frozen=True)
class WindowRecord:
    """Per-expert routed-token counts of one window: counts [L, E] summed over its passes, and
    ``steps`` [k, L, E], up to k single passes of it evenly spaced in time, oldest first (None
    when the engine's pass order is unknown: the planner's newest-level rule needs the order)."""

    counts: IntArray
    passes: int
    started_at: float
    ended_at: float
    meta: dict[str, Any] = field(default_factory=dict)
    steps: StepArray | None = None


def write_window(base: Path, record: WindowRecord, *, limit: int = SPOOL_LIMIT) -> Path:
    """Spool a window for the sidecar; drops the oldest pending ones beyond ``limit``."""
    directory = spool_dir(base)
    directory.mkdir(parents=True, exist_ok=True)
    meta = {
        **record.meta,
        "passes": record.passes,
        "started_at": record.started_at,
        "ended_at": record.ended_at,
    }
    path = directory / f"window-{time.time_ns():020d}-{os.getpid()}.npz"
    arrays = {"counts": np.ascontiguousarray(record.counts, dtype=np.int64)}
    if record.steps is not None:
        arrays["steps"] = np.ascontiguousarray(record.steps, dtype=np.int32)
    atomic_write_bytes(path, _npz_bytes(arrays, meta))
    pending = sorted(directory.glob("window-*.npz"))
    for old in pending[: max(0, len(pending) - limit)]:
        with contextlib.suppress(OSError):
            old.unlink()
    return path


def read_window(path: Path) -> WindowRecord:
    with load_npz(path) as data:
        counts = np.asarray(data["counts"], dtype=np.int64)
        steps = np.asarray(data["steps"], dtype=np.int32) if "steps" in data.files else None
        meta = json.loads(bytes(data["meta"]).decode())
    passes = int(meta.pop("passes"))
    started = float(meta.pop("started_at"))
    ended = float(meta.pop("ended_at"))
    if steps is not None and (steps.ndim != 3 or steps.shape[1:] != counts.shape or not steps.shape[0]):
        steps = None  # not this window's samples: the sums still stand
    return WindowRecord(counts, passes, started, ended, meta, steps)


def take_windows(base: Path) -> list[WindowRecord]:
    """Read and remove every spooled window, oldest first; unreadable files are dropped."""
    out: list[WindowRecord] = []
    directory = spool_dir(base)
    try:
        names = sorted(p for p in directory.iterdir() if p.name.startswith("window-") and p.suffix == ".npz")
    except OSError:
        return out
    for path in names:
        with contextlib.suppress(OSError, ValueError, KeyError):
            out.append(read_window(path))
        with contextlib.suppress(OSError):
            path.unlink()
    return out
