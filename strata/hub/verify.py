"""SHA-256 checks for model files: an explicit digest, a `<file>.sha256` sidecar, or a known model."""

from __future__ import annotations

import os
from pathlib import Path

from strata.console.progress import ProgressBar
from strata.gguf import GGUFFile

# Digests of the models Strata fetches itself (the default-model fetcher and the test assets).
KNOWN_SHA256 = {
    "SmolLM2-135M-Instruct.Q4_1.gguf": "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    "gemma-3-270m-q4_k_m.gguf": "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
}


def expected_sha256(path: str | os.PathLike[str]) -> str | None:
    p = Path(path)
    side = p.with_name(p.name + ".sha256")
    if side.is_file():
        return side.read_text().split()[0].strip().lower()
    return KNOWN_SHA256.get(p.name)


def verify_file(gguf: GGUFFile, expected: str | None) -> str:
    """Hash the file with a progress bar; raise ChecksumError on mismatch. Returns the digest."""
    bar = ProgressBar(f"sha256 {Path(gguf.path).name}", gguf.file_size)
    if expected:
        gguf.verify(expected, bar)
        return expected.lower()
    return gguf.sha256(bar)
