"""Where a big lookup table's rows come from (`--ple-io auto|ram|mmap|direct`): Qwen4-Exp's PLE n-gram table
is 320M rows (28.8 GiB in the seeds' file) and each token reads 16 of them.

- `mmap`: the file's mapping; rows come from the page cache, a first touch from disk.
- `ram`: the mapping locked in RAM (mlock reads it all in and keeps it); when the lock is refused (an 8 MB
  RLIMIT_MEMLOCK is common) the table stays with the page cache, read ahead, and start-up says so.
- `direct`: rows read with O_DIRECT (4 KiB-aligned, neighbouring rows in one read, no page cache), for
  machines whose RAM cannot hold the table; where the file system refuses O_DIRECT, plain reads.
- `auto`: `ram` when the table fits in half the available RAM, else `direct` (`choose`).

Every reader can start a gather on a helper thread (`prefetch`), so the rows of a pass are read while the
layers before the table's run. Counters: rows gathered, bytes read from disk (direct), seconds spent waiting.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import time
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from strata.errors import ConfigError
from strata.gguf import GGUFFile
from strata.tiers.telemetry import note

MODES = ("auto", "ram", "mmap", "direct")
BLOCK = 4096  # O_DIRECT's alignment of offsets, lengths and buffers (the logical block of most disks)


def check_mode(value: str, flag: str = "--ple-io") -> None:
    if value not in MODES:
        raise ConfigError(flag, value, f"must be one of {', '.join(MODES)}")


def choose(mode: str, table_bytes: int, available: int) -> str:
    """The mode `auto` resolves to: ram when the table fits in half the available RAM, else direct."""
    if mode != "auto":
        return mode
    return "ram" if table_bytes <= available // 2 else "direct"


def available_ram() -> int:
    """MemAvailable from /proc/meminfo, bytes (0 when unknown)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


@dataclass(slots=True)
class TableStats:
    """Table traffic: tokens hashed, rows gathered, their bytes, bytes read from disk, seconds waited."""

    tokens: int = 0
    rows: int = 0
    bytes: int = 0
    disk_bytes: int = 0
    wait_s: float = 0.0

    def per_token(self) -> tuple[float, float]:
        n = max(self.tokens, 1)
        return self.rows / n, self.bytes / n


class TableReader:
    """Rows of one 2-D tensor of a GGUF, as raw bytes [n, row_bytes]; `mode` says from where."""

    def __init__(self, g: GGUFFile, name: str, mode: str) -> None:
        info = g.tensors[name]
        self.info, self.path = info, g.path
        self.row_bytes = info.row_bytes
        self.view = g.raw(name)  # [n_rows, row_bytes] over the mapping
        self.stats = TableStats()
        self.mode = choose(mode, info.nbytes, available_ram())
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="strata-table")
        self._fd = -1
        if self.mode == "ram":
            self._lock()
        elif self.mode == "direct":
            self._open_direct()

    def _lock(self) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        addr = int(self.view.ctypes.data)
        start = addr - addr % mmap.PAGESIZE
        length = addr + self.view.nbytes - start
        t0 = time.monotonic()
        if libc.mlock(ctypes.c_void_p(start), ctypes.c_size_t(length)) == 0:
            note(f"PLE table: {length / 2**30:,.2f} GiB locked in RAM in {time.monotonic() - t0:.1f} s")
            return
        err = os.strerror(ctypes.get_errno())
        libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(length), mmap.MADV_WILLNEED)
        self.mode = "mmap"
        note(
            f"PLE table: locking {length / 2**30:,.2f} GiB in RAM was refused ({err}; raise ulimit -l); the "
            "rows stay with the page cache, read ahead, and may be paged out under memory pressure"
        )

    def _open_direct(self) -> None:
        try:
            self._fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_DIRECT", 0))
            self._direct = hasattr(os, "O_DIRECT")
        except OSError as err:
            self._fd, self._direct = os.open(self.path, os.O_RDONLY), False
            note(
                f"PLE table: O_DIRECT refused on {self.path} ({err.strerror}); reading rows with plain reads"
            )
        self._buf = mmap.mmap(-1, 1 << 20)  # page-aligned scratch for aligned reads, grown as needed
        self._closer = weakref.finalize(self, os.close, self._fd)  # a dropped model gives its descriptor back

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        if self._fd >= 0:
            self._closer()
            self._fd = -1

    def prefetch(self, rows: np.ndarray) -> Future[np.ndarray]:
        """Start gathering rows (any shape of row ids) on the helper thread."""
        return self._pool.submit(self._gather, np.asarray(rows, np.int64).reshape(-1))

    def take(self, pending: Future[np.ndarray], n_tokens: int) -> np.ndarray:
        """The rows a prefetch gathered [n, row_bytes] (waiting for them if they are not in yet)."""
        t0 = time.perf_counter()
        out = pending.result()
        self.stats.wait_s += time.perf_counter() - t0
        self.stats.tokens += n_tokens
        self.stats.rows += out.shape[0]
        self.stats.bytes += out.nbytes
        return out

    def gather(self, rows: np.ndarray, n_tokens: int) -> np.ndarray:
        """The rows now, read on this thread (a hop to the helper thread would only add its wake-up)."""
        done: Future[np.ndarray] = Future()
        done.set_result(self._gather(np.asarray(rows, np.int64).reshape(-1)))
        return self.take(done, n_tokens)

    def _gather(self, flat: np.ndarray) -> np.ndarray:
        if self.mode != "direct":
            return self.view[flat]  # fancy indexing copies just these rows out of the mapping
        return self._read_direct(flat)

    def _read_direct(self, flat: np.ndarray) -> np.ndarray:
        """Each run of 4 KiB blocks that holds wanted rows, read once, aligned; rows copied out of it."""
        rb, base = self.row_bytes, self.info.offset
        out = np.empty((flat.size, rb), np.uint8)
        order = np.argsort(flat, kind="stable")
        lo = (base + flat * rb) // BLOCK * BLOCK  # [n] first block of each row
        hi = -(-(base + (flat + 1) * rb) // BLOCK) * BLOCK
        i = 0
        while i < flat.size:  # rows in file order; neighbouring or overlapping block runs merge into one read
            j, start, end = i, lo[order[i]], hi[order[i]]
            while j + 1 < flat.size and lo[order[j + 1]] <= end:
                j += 1
                end = max(end, hi[order[j]])
            data = self._pread(int(start), int(end - start))
            for k in order[i : j + 1]:
                off = base + int(flat[k]) * rb - int(start)
                out[k] = data[off : off + rb]
            i = j + 1
        return out

    def _pread(self, offset: int, length: int) -> np.ndarray:
        if length > len(self._buf):
            self._buf = mmap.mmap(-1, -(-length // (1 << 20)) * (1 << 20))
        view = memoryview(self._buf)[:length]
        got = os.preadv(self._fd, [view], offset)
        self.stats.disk_bytes += got
        return np.frombuffer(self._buf, np.uint8, got)
