"""--override-kv KEY=TYPE:VALUE (llama-server's syntax): a qwen4exp file whose converter wrote every
attention.compress_ratios as 0 is refused with the flag named, and loads with the override to the
transformers oracle; bad overrides are refused naming the flag."""

from __future__ import annotations

import json
import subprocess
import sys
from functools import partial
from pathlib import Path

import pytest
from flagship_checks import build, check_prompt_logits
from oracle import assets, flagship

from strata.conf.engine import parse_overrides
from strata.engine import Engine
from strata.errors import ConfigError, GGUFError

KEY = "qwen4exp.attention.compress_ratios"


@pytest.fixture(scope="module")
def zero_ratio_file(tmp_path_factory) -> tuple[Path, dict, int]:
    """The qwen4exp fixture as today's converter writes it: every compress ratio 0."""
    import gguf
    import gguf.scripts.gguf_new_metadata as gnm

    fx = build(flagship.tiny_qwen4exp)
    ratio = json.loads(Path(fx["recipe"]).read_text())["config"]["indexer_compress_ratio"]
    reader = gguf.GGUFReader(fx["f32"])
    n = len(reader.get_field(KEY).contents())
    out = tmp_path_factory.mktemp("zero") / "qwen4exp-zero-ratios.gguf"
    writer = gguf.GGUFWriter(out, arch="qwen4exp")
    bar, gnm.tqdm = gnm.tqdm, partial(gnm.tqdm, disable=True)
    try:
        gnm.copy_with_new_metadata(
            reader, writer, {KEY: gnm.MetadataDetails(gguf.GGUFValueType.ARRAY, [0] * n)}, []
        )
    finally:
        gnm.tqdm = bar
    return out, assets.load_npz(fx["oracle"]), ratio


def test_zero_ratios_are_refused_naming_the_flag(zero_ratio_file):
    path, _, _ = zero_ratio_file
    with pytest.raises(GGUFError, match="--override-kv qwen4exp.attention.compress_ratios=int:N"):
        Engine.load(path, backend="numpy", device="cpu")


def test_the_override_loads_it_to_the_oracle(zero_ratio_file):
    path, ref, ratio = zero_ratio_file
    eng = Engine.load(path, backend="numpy", device="cpu", override_kv=(f"{KEY}=int:{ratio}",))
    check_prompt_logits(eng, ref)


def test_info_and_generate_take_the_flag(zero_ratio_file):
    path, _, ratio = zero_ratio_file
    run = partial(subprocess.run, capture_output=True, text=True, timeout=300)
    out = run(
        [
            sys.executable,
            "-m",
            "strata",
            "generate",
            "--model",
            str(path),
            "--prompt",
            "hi",
            "--max-tokens",
            "2",
            "--backend",
            "numpy",
            "--device",
            "cpu",
            "--override-kv",
            f"{KEY}=int:{ratio}",
            "--json",
        ]
    )
    assert out.returncode == 0, out.stderr
    refused = run(
        [
            sys.executable,
            "-m",
            "strata",
            "generate",
            "--model",
            str(path),
            "--prompt",
            "hi",
            "--backend",
            "numpy",
            "--device",
            "cpu",
        ]
    )
    assert refused.returncode == 1 and "--override-kv" in refused.stderr
    assert (
        run(
            [sys.executable, "-m", "strata", "info", str(path), "--override-kv", f"{KEY}=int:{ratio}"]
        ).returncode
        == 0
    )


def test_override_syntax():
    assert parse_overrides(["a.b=int:4", "c=float:0.5", "d=bool:true", "e=str:x=y:z"]) == {
        "a.b": 4,
        "c": 0.5,
        "d": True,
        "e": "x=y:z",
    }
    for bad in ("a.b", "a.b=4", "a=int:x", "a=list:1", "=int:1", "a=bool:maybe"):
        with pytest.raises(ConfigError, match="--override-kv"):
            parse_overrides([bad])
