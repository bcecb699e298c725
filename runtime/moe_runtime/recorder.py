"""SGLang's expert-distribution recorder dump (stat mode), read and written without torch.

Static placement (``eplb.mode: static``) runs SGLang without ``--enable-eplb``: no rebalance,
so no window ever reaches the plugin. The launcher turns on the recorder instead
(``--expert-distribution-recorder-mode stat``) and the leader's sidecar asks SGLang for a
dump every few seconds (``POST /dump_expert_distribution_record``). In stat mode every rank
all-reduces its circular buffer and global rank 0 alone writes
``$SGLANG_EXPERT_DISTRIBUTION_RECORDER_DIR/expert_distribution_recorder_<time>.pt`` with
``torch.save``: ``{"rank": 0, "logical_count": int32 [buffer, layers, logical experts],
"average_utilization_rate_over_window": float | None}``, then resets the buffer
(sglang/srt/eplb/expert_distribution.py, ``_StatAccumulator.dump``). Rows of passes not
recorded yet are zero. A dump resets the recorder that in-engine EPLB reads: it is harmless
only when EPLB is off, so nothing here runs in modes operator or engine.

Why no torch: the sidecar runs in the launcher's process, which never imports torch (2 s
and ~500 MB), and the replay engine has no torch at all. The file is a zip archive holding
a protocol-2 pickle and one raw little-endian storage per tensor. ``read_dump`` unpickles it
with a closed set of globals (tensor rebuild, typed storages, OrderedDict); anything else
is refused. ``write_dump`` writes what ``torch.save`` writes for the same dict (the replay
engine's stand-in recorder), and ``torch.load`` reads it back (tests/runtime).
"""

from __future__ import annotations

import collections
import io
import math
import os
import pickle
import struct
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from moe_placement.maps import IntArray
from moe_runtime import exchange

START_PATH = "/start_expert_distribution_record"
DUMP_PATH = "/dump_expert_distribution_record"
DIR_ENV = "SGLANG_EXPERT_DISTRIBUTION_RECORDER_DIR"
PREFIX = "expert_distribution_recorder_"
MAX_DUMP_BYTES = 1 << 30  # 1000 passes x 61 layers x 256 experts x int32 is 62 MB
MAX_PICKLE_BYTES = 1 << 16
_DTYPES: dict[str, np.dtype[Any]] = {
    "IntStorage": np.dtype("<i4"),
    "LongStorage": np.dtype("<i8"),
    "ShortStorage": np.dtype("<i2"),
    "CharStorage": np.dtype("i1"),
    "ByteStorage": np.dtype("u1"),
    "FloatStorage": np.dtype("<f4"),
    "DoubleStorage": np.dtype("<f8"),
}


class DumpError(ValueError):
    """A file that is not a stat-mode recorder dump (or one this reader will not trust)."""


@dataclass(frozen=True)
class Dump:
    rank: int
    logical_count: npt.NDArray[Any]  # [buffer, layers, logical experts]
    average_utilization: float | None


def recorder_dir(state_dir: Path) -> Path:
    """Where the launcher points SGLang's recorder (SGLANG_EXPERT_DISTRIBUTION_RECORDER_DIR)."""
    return state_dir / "recorder"


# ---------------------------------------------------------------- reading


@dataclass(frozen=True)
class _StorageType:
    name: str


def _rebuild_tensor(
    storage: Any, offset: Any, size: Any, stride: Any, requires_grad: Any, hooks: Any, *rest: Any
) -> npt.NDArray[Any]:
    """torch._utils._rebuild_tensor_v2, as a bounds-checked numpy view copied out."""
    if not isinstance(storage, np.ndarray) or storage.ndim != 1:
        raise DumpError("tensor without a storage")
    ints = (offset, *size, *stride)
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in ints):
        raise DumpError("tensor offset, size and stride must be non-negative integers")
    if len(size) != len(stride) or len(size) > 4 or rest[1:]:
        raise DumpError("unexpected tensor layout")
    last = offset + sum((n - 1) * s for n, s in zip(size, stride, strict=True)) if all(size) else offset - 1
    if last >= storage.size:
        raise DumpError(f"tensor reaches element {last} of a storage of {storage.size}")
    item = storage.itemsize
    view = np.lib.stride_tricks.as_strided(
        storage[offset:], shape=tuple(size), strides=tuple(s * item for s in stride), writeable=False
    )
    return np.array(view)


class _Unpickler(pickle.Unpickler):
    def __init__(self, data: bytes, archive: zipfile.ZipFile, prefix: str) -> None:
        super().__init__(io.BytesIO(data))
        self.archive = archive
        self.prefix = prefix

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return _rebuild_tensor
        if module == "torch" and name in _DTYPES:
            return _StorageType(name)
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        raise DumpError(f"the dump references {module}.{name}, which a recorder dump never holds")

    def persistent_load(self, pid: Any) -> Any:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise DumpError("unexpected persistent id")
        _, kind, key, _location, numel = pid
        if not isinstance(kind, _StorageType) or not isinstance(key, str) or not key.isdigit():
            raise DumpError("unexpected storage reference")
        dtype = _DTYPES[kind.name]
        try:
            info = self.archive.getinfo(f"{self.prefix}/data/{key}")
        except KeyError as exc:
            raise DumpError(f"storage {key} missing") from exc
        if info.compress_type != zipfile.ZIP_STORED or info.file_size != numel * dtype.itemsize:
            raise DumpError(f"storage {key}: {info.file_size} bytes for {numel} x {dtype}")
        return np.frombuffer(self.archive.read(info), dtype=dtype)


def read_dump(path: Path, max_bytes: int = MAX_DUMP_BYTES) -> Dump:
    """Parse one dump file; raises DumpError on anything but SGLang's stat-mode dump."""
    try:  # a regular file only: the engine container shares the directory (exchange.read_regular)
        raw = exchange.read_regular(path, max_bytes)
    except OSError as exc:
        raise DumpError(f"cannot read {path.name}: {exc}") from exc
    try:
        with zipfile.ZipFile(io.BytesIO(raw)) as archive:
            pkl = [n for n in archive.namelist() if n.endswith("/data.pkl") and n.count("/") == 1]
            if len(pkl) != 1:
                raise DumpError(f"{path.name} is not a torch.save archive")
            info = archive.getinfo(pkl[0])
            if info.file_size > MAX_PICKLE_BYTES or info.compress_type != zipfile.ZIP_STORED:
                raise DumpError("unexpected data.pkl")
            obj = _Unpickler(archive.read(info), archive, pkl[0].split("/")[0]).load()
    except (zipfile.BadZipFile, pickle.UnpicklingError, EOFError, OSError, TypeError) as exc:
        raise DumpError(f"{path.name}: {type(exc).__name__}: {exc}") from exc
    return _dump_of(obj)


def _dump_of(obj: Any) -> Dump:
    if not isinstance(obj, dict) or "logical_count" not in obj:
        raise DumpError("not a stat-mode dump: no logical_count (recorder mode per_pass or per_token?)")
    counts = obj["logical_count"]
    if not isinstance(counts, np.ndarray) or counts.ndim != 3 or counts.dtype.kind not in "iu":
        raise DumpError("logical_count must be an integer tensor [buffer, layers, experts]")
    if counts.size and int(counts.min()) < 0:
        raise DumpError("logical_count holds negative counts")
    rank = obj.get("rank", 0)
    avg = obj.get("average_utilization_rate_over_window")
    if not isinstance(rank, int) or (avg is not None and not isinstance(avg, float | int)):
        raise DumpError("unexpected rank or average_utilization_rate_over_window")
    if avg is not None and not math.isfinite(avg):
        avg = None
    return Dump(rank, counts, None if avg is None else float(avg))


def window(dump: Dump) -> tuple[IntArray, int]:
    """Counts [layers, experts] summed over the buffer, and the passes (rows) that routed tokens."""
    counts = dump.logical_count
    return counts.sum(axis=0, dtype=np.int64), int(np.count_nonzero(exchange.routed_passes(counts)))


def take_dumps(directory: Path) -> list[Path]:
    """The dump files there, oldest first (names carry SGLang's time.time())."""
    try:
        found = [p for p in directory.iterdir() if p.name.startswith(PREFIX) and p.suffix == ".pt"]
    except OSError:
        return []
    return sorted(found)


# ---------------------------------------------------------------- writing (replay engine, tests)


def _pickle_dump(shape: tuple[int, ...], rank: int, average: float | None) -> bytes:
    """The protocol-2 pickle torch.save writes for the dump dict with one int32 CPU tensor."""
    out = bytearray(b"\x80\x02}q\x00(")

    def text(s: str) -> None:
        raw = s.encode()
        out.extend(b"X" + struct.pack("<I", len(raw)) + raw)

    def integer(v: int) -> None:
        out.extend(b"J" + struct.pack("<i", v))

    def tup(values: tuple[int, ...]) -> None:
        out.extend(b"(")
        for v in values:
            integer(v)
        out.extend(b"t")

    stride = tuple(int(np.prod(shape[i + 1 :], dtype=np.int64)) for i in range(len(shape)))
    text("rank")
    integer(rank)
    text("logical_count")
    out.extend(b"ctorch._utils\n_rebuild_tensor_v2\n((")
    text("storage")
    out.extend(b"ctorch\nIntStorage\n")
    text("0")
    text("cpu")
    integer(int(np.prod(shape, dtype=np.int64)))
    out.extend(b"tQ")  # the storage tuple, as a persistent id
    integer(0)
    tup(shape)
    tup(stride)
    out.extend(b"\x89ccollections\nOrderedDict\n)Rt")  # requires_grad False, empty backward hooks
    out.extend(b"R")
    text("average_utilization_rate_over_window")
    out.extend(b"N" if average is None else b"G" + struct.pack(">d", average))
    out.extend(b"u.")
    return bytes(out)


def _aligned(archive: zipfile.ZipFile, name: str, data: bytes, align: int = 64) -> None:
    """A stored record whose data starts at a multiple of ``align`` (as torch writes them)."""
    info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
    info.compress_type = zipfile.ZIP_STORED
    assert archive.fp is not None
    offset = archive.fp.tell() + 30 + len(name.encode())
    pad = (-(offset + 4)) % align
    info.extra = b"FB" + struct.pack("<H", pad) + b"Z" * pad
    archive.writestr(info, data)


def write_dump(
    path: Path, logical_count: npt.ArrayLike, *, rank: int = 0, average: float | None = None
) -> None:
    """Write ``logical_count`` [buffer, layers, experts] as SGLang's rank 0 does (atomically)."""
    counts = np.ascontiguousarray(logical_count, dtype="<i4")
    if counts.ndim != 3:
        raise ValueError("logical_count must be [buffer, layers, experts]")
    prefix = path.name.removesuffix(".pt")
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as archive:
        _aligned(archive, f"{prefix}/data.pkl", _pickle_dump(counts.shape, rank, average))
        _aligned(archive, f"{prefix}/.format_version", b"1")
        _aligned(archive, f"{prefix}/.storage_alignment", b"64")
        _aligned(archive, f"{prefix}/byteorder", b"little")
        _aligned(archive, f"{prefix}/data/0", counts.tobytes())
        _aligned(archive, f"{prefix}/version", b"3\n")
        _aligned(archive, f"{prefix}/.data/serialization_id", os.urandom(20).hex().encode())
    exchange.atomic_write_bytes(path, buf.getvalue())


def dump_name(now: float | None = None) -> str:
    """SGLang's file name: expert_distribution_recorder_{time.time()}.pt."""
    return f"{PREFIX}{time.time() if now is None else now}.pt"
