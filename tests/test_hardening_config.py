"""Issue 13, item 9: start-up refuses a --ctx-size beyond the model's trained context and names a
directory given as --model, each in one line that names the flag and the value."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def serve(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "strata", "serve", "--port", "1", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_ctx_size_above_the_trained_context_is_refused(smollm2_path: Path) -> None:
    r = serve("--model", str(smollm2_path), "--ctx-size", "100000")
    assert r.returncode == 1
    assert r.stderr.strip() == (
        f"strata: error: --ctx-size=100000: {smollm2_path.name} was trained for at most 8192 tokens"
    )


def test_a_directory_as_model_is_named(tmp_path: Path) -> None:
    r = serve("--model", str(tmp_path))
    assert r.returncode == 1
    assert (
        r.stderr.strip()
        == f"strata: error: --model={str(tmp_path)!r}: is a directory; give the path of a .gguf file"
    )
    assert "Errno" not in r.stderr


def test_bad_hardening_flags_name_the_flag(smollm2_path: Path) -> None:
    for flag in ("--max-body-mib", "--watchdog-s", "--shutdown-grace-s"):
        r = serve("--model", str(smollm2_path), flag, "nan")
        assert r.returncode == 1 and f"{flag}=nan" in r.stderr, r.stderr
