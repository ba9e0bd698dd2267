"""Routing profiles: how often each (MoE layer, expert) was routed to, saved in the cache dir so that the next
start fills the expert cache with the experts this workload uses instead of the static fill's lowest ids.

A profile is `uses` float64 [L, E] (routed lookups) plus the tokens counted, at
`<cache dir>/profiles/<sha256 of the model>.npz` (the cache dir: $STRATA_CACHE_DIR, else ~/.cache/strata):
keyed by the file's digest, since the model's folder may be read-only and a path says nothing about its
contents. Hashing a 40 GB file takes half a minute, so the digest comes from a `.sha256` sidecar or the known
models when there is one, else from `digests.json` in the cache dir (keyed by path, size and mtime); when none
is known yet, it is computed on a helper thread while the engine serves, and the profile is saved once it is
known.

`python -m strata profile MODEL --prompts FILE` builds one ahead of time; `--routing-profile off` neither
reads nor writes one.

Legend: L = MoE layers, E = experts per layer.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from strata.errors import ConfigError

MODES = ("auto", "off")
CACHE_ENV = (
    "STRATA_CACHE_DIR"  # where profiles and digests live (default: beside the JIT cache, ~/.cache/strata)
)


def cache_root(jit_cache: str | None) -> Path:
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    return Path(jit_cache).parent if jit_cache else Path.home() / ".cache/strata"


def check_mode(mode: str, flag: str = "--routing-profile") -> None:
    if mode not in MODES:
        raise ConfigError(flag, mode, f"must be one of {', '.join(MODES)}")


@dataclass(slots=True)
class Profile:
    uses: np.ndarray  # float64 [L, E]: routed lookups
    tokens: int = 0  # tokens counted (each routes every layer once)

    def add(self, li: int, ids: np.ndarray) -> None:
        """Count the routed ids [T, A] of MoE layer li (li == 0 counts the tokens)."""
        self.uses[li] += np.bincount(np.asarray(ids).reshape(-1), minlength=self.uses.shape[1])
        if li == 0:
            self.tokens += int(np.asarray(ids).shape[0])

    def add_all(self, ids: np.ndarray) -> None:
        """Count a pass's routed ids [T, L, A] of every layer at once."""
        n_l, n_e = self.uses.shape
        flat = (np.arange(n_l)[None, :, None] * n_e + ids).reshape(-1)
        self.uses += np.bincount(flat, minlength=n_l * n_e).reshape(n_l, n_e)
        self.tokens += int(ids.shape[0])

    def top(self, slots: np.ndarray) -> np.ndarray:
        """[L, E] bool: each layer's slots[l] most used experts (ties: the lower id)."""
        out = np.zeros(self.uses.shape, bool)
        for li, k in enumerate(np.asarray(slots).tolist()):
            out[li, np.argsort(-self.uses[li], kind="stable")[:k]] = True
        return out


def path_for(root: Path, digest: str) -> Path:
    return root / "profiles" / f"{digest}.npz"


def save(root: Path, digest: str, p: Profile) -> Path:
    return save_file(path_for(root, digest), p)


def load(root: Path, digest: str, shape: tuple[int, int]) -> Profile | None:
    """The saved profile, or None when there is none or it does not fit this model's shape (a stale or foreign
    file is ignored, never an error)."""
    return load_file(path_for(root, digest), shape)


def save_file(out: Path, p: Profile) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp.npz")
    np.savez_compressed(tmp, uses=p.uses, tokens=np.int64(p.tokens))
    os.replace(tmp, out)  # a reader never sees half a file
    return out


def load_file(path: Path, shape: tuple[int, int]) -> Profile | None:
    try:
        with np.load(path) as z:
            uses, tokens = z["uses"].astype(np.float64), int(z["tokens"])
    except (OSError, KeyError, ValueError):
        return None
    return Profile(uses, tokens) if uses.shape == shape else None


class Digests:
    """The model's SHA-256, without hashing it at every start: a sidecar or known digest, else the cache dir's
    `digests.json` (path, size and mtime -> digest), filled by `compute`."""

    def __init__(self, root: Path) -> None:
        self.file = root / "digests.json"
        self._lock = threading.Lock()

    @staticmethod
    def _key(path: str) -> str:
        st = os.stat(path)
        return f"{os.path.realpath(path)}|{st.st_size}|{st.st_mtime_ns}"

    def _read(self) -> dict[str, str]:
        try:
            return json.loads(self.file.read_text())
        except (OSError, ValueError):
            return {}

    def known(self, path: str) -> str | None:
        from strata.hub.verify import expected_sha256

        return expected_sha256(path) or self._read().get(self._key(path))

    def compute(self, gguf: object) -> str:
        """Hash the file (minutes for the largest models) and remember the digest."""
        digest = gguf.sha256()  # type: ignore[attr-defined]
        with self._lock:
            table = self._read()
            table[self._key(gguf.path)] = digest  # type: ignore[attr-defined]
            self.file.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.file.with_name(self.file.name + ".tmp")
            tmp.write_text(json.dumps(table, indent=1))
            os.replace(tmp, self.file)
        return digest


class Keeper:
    """The engine's side: counts while it serves and saves at exit under the model's digest, computed on a
    helper thread when it is not known yet."""

    def __init__(
        self, root: Path, gguf: object, profile: Profile, digest: str | None, saved: Profile | None = None
    ) -> None:
        self.root, self.profile, self.digest = root, profile, digest
        self.saved = saved  # the profile this start filled the cache from, if there was one
        self._gguf = gguf
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Counting begins: hash the file on a helper thread if its digest is not known yet."""
        if self.digest is None and self._thread is None:
            self._thread = threading.Thread(
                target=self._hash, args=(self._gguf,), name="strata-digest", daemon=True
            )
            self._thread.start()

    def _hash(self, gguf: object) -> None:
        try:
            self.digest = Digests(self.root).compute(gguf)
        except OSError:
            self.digest = None

    def wait(self) -> None:
        """Until the digest is known (it is being computed on the helper thread)."""
        if self._thread is not None:
            self._thread.join()

    def save(self) -> Path | None:
        """Write the profile (None: nothing counted yet, or the digest is still being computed)."""
        if self.digest is None or self.profile.tokens == 0:
            return None
        try:
            return save(self.root, self.digest, self.profile)
        except OSError:
            return None
