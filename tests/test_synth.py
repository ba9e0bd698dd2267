"""Synthetic GGUF writer (issue #7): the tiny files load and run in Strata and in llama.cpp (when it is
built), names/shapes/keys are llama.cpp's, block magnitudes are sane, and the router skew produces
cacheable expert popularity."""

from __future__ import annotations

import hashlib
import re
import subprocess
from pathlib import Path
from types import SimpleNamespace

import gguf
import numpy as np
import pytest
from gguf.constants import MODEL_TENSORS, TENSOR_NAMES
from gguf.constants import GGMLQuantizationType as Q

from strata.cli import main
from strata.engine import Engine
from strata.gguf import GGUFFile
from strata.quants import dequantize
from strata.synth import (
    SHAPES,
    SUPPORTED,
    Shape,
    expected_hit_rate,
    file_hit_rate,
    hit_rate,
    router_weights,
    tensor_plan,
    write_synth,
)
from strata.synth.blocks import pool
from strata.synth.plan import QK_GAIN, attn_out_std
from strata.synth.vocab import QWEN3_VOCAB_SIZE, vocab_base

LLAMA_BIN = Path("~/.cache/strata-peer/build/bin").expanduser()
ARCH_ENUM = {"qwen3moe": gguf.MODEL_ARCH.QWEN3MOE, "qwen3next": gguf.MODEL_ARCH.QWEN3NEXT}
TINY = [SHAPES[("qwen3moe", "tiny")], SHAPES[("qwen3next", "tiny")]]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory, qwen3_tokenizer_dir: Path) -> dict[str, Path]:
    """Both tiny files, Q4_K (Q6_K output would be ignored: tiny ties the head to token_embd)."""
    root = tmp_path_factory.mktemp("synth")
    return {
        s.arch: write_synth(root / f"{s.arch}.gguf", s, Q.Q4_K, Q.Q6_K, 1.0, qwen3_tokenizer_dir).path
        for s in TINY
    }


# ---------------------------------------------------------------- runs in Strata and llama.cpp


@pytest.mark.parametrize("arch", ["qwen3moe", "qwen3next"])
def test_tiny_loads_and_runs_in_strata(tiny: dict[str, Path], arch: str) -> None:
    engine = Engine.load(tiny[arch])
    logits = engine.logits([1, 2, 3])
    assert logits.shape == (3, QWEN3_VOCAB_SIZE) and np.isfinite(logits).all()
    assert 0.01 < float(logits.std()) < 100.0
    assert engine.tokenizer.encode("Hello world") == [9707, 1879]  # the real Qwen3 vocabulary
    assert "<|im_start|>" in engine.template.render(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True
    )


def _llama_cmd(path: Path) -> list[str] | None:
    for name, args in (
        ("llama-completion", ["-p", "Hello", "-n", "4", "-no-cnv", "--temp", "0"]),
        ("llama-cli", ["-p", "Hello", "-n", "4", "-no-cnv", "--temp", "0"]),
        ("llama-bench", ["-p", "8", "-n", "4", "-r", "1"]),
    ):
        if (LLAMA_BIN / name).is_file():
            return [str(LLAMA_BIN / name), "-m", str(path), "-t", "2", *args]
    return None


@pytest.mark.parametrize("arch", ["qwen3moe", "qwen3next"])
def test_llama_cpp_runs_tiny(tiny: dict[str, Path], arch: str) -> None:
    cmd = _llama_cmd(tiny[arch])
    if cmd is None:
        pytest.skip(f"llama.cpp is not built (no llama-completion/llama-cli/llama-bench in {LLAMA_BIN})")
    out = subprocess.run(
        cmd, check=False, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL
    )
    assert out.returncode == 0, out.stderr[-3000:]


# ---------------------------------------------------------------- llama.cpp's names, shapes and keys


def llama_cpp_shapes(s: Shape) -> dict[str, tuple[int, ...]]:
    """ne of every tensor llama.cpp's loader creates for this shape, transcribed from
    src/models/qwen3moe.cpp and qwen3next.cpp (load_arch_tensors); output.weight is optional there."""
    d, v, hd, e, f = s.d_model, s.vocab, s.head_dim, s.n_expert, s.expert_ff
    out = {"token_embd.weight": (d, v), "output_norm.weight": (d,)}
    if not s.tied:
        out["output.weight"] = (d, v)
    for i in range(s.n_layer):
        b = f"blk.{i}."
        layer = {
            "attn_norm.weight": (d,),
            "ffn_gate_inp.weight": (d, e),
            "ffn_gate_exps.weight": (d, f, e),
            "ffn_up_exps.weight": (d, f, e),
            "ffn_down_exps.weight": (f, d, e),
        }
        attn = {
            "attn_q.weight": (d, hd * s.n_head * (2 if s.arch == "qwen3next" else 1)),
            "attn_k.weight": (d, hd * s.n_kv),
            "attn_v.weight": (d, hd * s.n_kv),
            "attn_output.weight": (hd * s.n_head, d),
            "attn_q_norm.weight": (hd,),
            "attn_k_norm.weight": (hd,),
        }
        if s.arch == "qwen3moe":
            layer |= attn | {"ffn_norm.weight": (d,)}
        else:
            kd = s.lin_head_dim * s.lin_k_heads
            vd = s.lin_head_dim * s.lin_v_heads
            layer |= {
                "post_attention_norm.weight": (d,),
                "ffn_gate_inp_shexp.weight": (d,),
                "ffn_gate_shexp.weight": (d, s.shared_ff),
                "ffn_up_shexp.weight": (d, s.shared_ff),
                "ffn_down_shexp.weight": (s.shared_ff, d),
            }
            layer |= (
                attn
                if (i + 1) % s.full_attn_interval == 0
                else {
                    "attn_qkv.weight": (d, 2 * kd + vd),
                    "attn_gate.weight": (d, vd),
                    "ssm_conv1d.weight": (s.conv_kernel, 2 * kd + vd),
                    "ssm_dt.bias": (s.lin_v_heads,),
                    "ssm_a": (s.lin_v_heads,),
                    "ssm_ba.weight": (d, 2 * s.lin_v_heads),
                    "ssm_norm.weight": (s.lin_head_dim,),
                    "ssm_out.weight": (vd, d),
                }
            )
        out |= {b + k: ne for k, ne in layer.items()}
    return out


def _same_ne(got: tuple[int, ...], want: tuple[int, ...]) -> bool:
    """llama.cpp's check_tensor_dims: equal, trailing dims beyond `want` must be 1."""
    return got[: len(want)] == want and all(x == 1 for x in got[len(want) :])


@pytest.mark.parametrize("key", sorted(SHAPES), ids=lambda k: "-".join(k))
def test_plan_matches_llama_cpp(key: tuple[str, str]) -> None:
    s = SHAPES[key]
    plan = tensor_plan(s, Q.Q4_K, Q.Q6_K)
    want = llama_cpp_shapes(s)
    got = {t.name: tuple(reversed(t.shape)) for t in plan}  # numpy order -> ne
    assert len(got) == len(plan) and set(got) == set(want)
    bad = [(n, got[n], want[n]) for n in want if not _same_ne(got[n], want[n])]
    assert not bad, bad[:5]
    known = {TENSOR_NAMES[t] for t in MODEL_TENSORS[ARCH_ENUM[s.arch]]}
    unknown = {_generic(n) for n in got} - known
    assert not unknown, unknown  # every name is one gguf's constants list for the architecture


def _generic(name: str) -> str:
    """'blk.3.ssm_dt.bias' -> 'blk.{bid}.ssm_dt', as gguf.constants.TENSOR_NAMES spells it."""
    name = re.sub(r"^blk\.\d+\.", "blk.{bid}.", name)
    return name.removesuffix(".weight").removesuffix(".bias")


@pytest.mark.parametrize("arch", ["qwen3moe", "qwen3next"])
def test_written_file_matches_plan_and_converter_keys(tiny: dict[str, Path], arch: str) -> None:
    from oracle import assets, flagship

    g = GGUFFile(tiny[arch])
    plan = tensor_plan(SHAPES[(arch, "tiny")], Q.Q4_K, Q.Q6_K)
    assert {(t.name, t.shape, t.qtype) for t in plan} == {
        (t.name, t.shape, t.qtype) for t in g.tensors.values()
    }
    ref = assets.tiny_qwen3moe()["q8_0"] if arch == "qwen3moe" else flagship.tiny_qwen3next()["f32"]
    converter = {k for k in GGUFFile(ref).metadata if not k.startswith("tokenizer.")}
    ours = set(g.metadata)
    assert converter <= ours, converter - ours  # every hparam the converter writes, nothing renamed
    assert {k for k in ours - converter if not k.startswith("tokenizer.")} == {
        "strata.synth.router_skew",
        "strata.synth.seed",
    }
    for key in ("tokens", "token_type", "merges", "pre", "eos_token_id", "padding_token_id", "bos_token_id"):
        assert f"tokenizer.ggml.{key}" in ours
    assert g.get("tokenizer.ggml.pre") == "qwen2" and g.get("tokenizer.chat_template")


@pytest.mark.slow
def test_vocab_matches_converter_logic(qwen3_tokenizer_dir: Path) -> None:
    """strata.synth.vocab (tokenizers only) == the converter's get_vocab_base on transformers."""
    from tokenizer_helpers import _vocab_base, hf_dir_tokenizer

    tokens, types = vocab_base(qwen3_tokenizer_dir, QWEN3_VOCAB_SIZE)
    ref_tokens, ref_types = _vocab_base(hf_dir_tokenizer(str(qwen3_tokenizer_dir)), QWEN3_VOCAB_SIZE)
    assert tokens == ref_tokens and types == ref_types


# ---------------------------------------------------------------- magnitudes


@pytest.mark.parametrize("qtype", sorted(SUPPORTED, key=lambda q: q.name), ids=lambda q: q.name)
def test_pool_blocks_dequantize_to_target_std(qtype: Q) -> None:
    y = dequantize(pool(qtype, 0.02), qtype)
    assert np.isfinite(y).all()
    assert abs(float(y.std()) - 0.02) < 0.001 and abs(float(y.mean())) < 0.001


@pytest.mark.parametrize("quant", ["q4_k", "q8_0", "q4_0", "q6_k", "q5_k", "iq4_xs"])
def test_written_weights_have_sane_magnitudes(tmp_path: Path, qwen3_tokenizer_dir: Path, quant: str) -> None:
    qt = Q[quant.upper()]
    path = write_synth(
        tmp_path / "m.gguf", SHAPES[("qwen3moe", "tiny")], qt, qt, 1.0, qwen3_tokenizer_dir
    ).path
    g = GGUFFile(path)
    out_std = attn_out_std(SHAPES[("qwen3moe", "tiny")].n_layer)  # 0.02 / sqrt(2 n_layer)
    for name, lo, hi in (
        ("blk.0.attn_q.weight", 0.018, 0.022),
        ("blk.1.ffn_down_exps.weight", 0.018, 0.022),
        ("token_embd.weight", 0.018, 0.022),
        ("blk.1.attn_output.weight", 0.9 * out_std, 1.1 * out_std),
        ("blk.0.attn_norm.weight", 0.0, 0.05),
    ):
        t = g.tensors[name]
        assert t.qtype == (qt if len(t.shape) > 1 else Q.F32)
        y = dequantize(
            g.raw(name).reshape(-1, t.row_bytes)[:4096], t.qtype, t.shape[-1]
        )  # first rows suffice
        assert np.isfinite(y).all() and lo <= float(y.std()) <= hi, (name, float(y.std()))
    assert abs(float(dequantize(g.raw("output_norm.weight"), Q.F32).mean()) - 1.0) < 0.01  # norms ~ 1
    qk = dequantize(g.raw("blk.0.attn_q_norm.weight"), Q.F32)
    assert abs(float(qk.mean()) - QK_GAIN) < 0.05  # sharp attention (plan.py QK_GAIN)


def test_same_seed_same_file(tmp_path: Path, qwen3_tokenizer_dir: Path) -> None:
    s = SHAPES[("qwen3moe", "tiny")]
    digests = {
        hashlib.sha256(
            write_synth(
                tmp_path / f"{seed}-{i}.gguf", s, Q.Q8_0, Q.Q8_0, 1.0, qwen3_tokenizer_dir, seed=seed
            ).path.read_bytes()
        ).hexdigest()
        for seed, i in ((0, 0), (0, 1), (1, 0))
    }
    assert len(digests) == 2


# ---------------------------------------------------------------- router skew


def test_router_skew_makes_top_quarter_cover_majority() -> None:
    s = SHAPES[("qwen3moe", "30b-a3b")]
    rng = np.random.default_rng(0)
    skewed = router_weights(s.d_model, s.n_expert, s.top_k, 1.0, rng)
    uniform = router_weights(s.d_model, s.n_expert, s.top_k, 0.0, rng)
    hit = hit_rate(skewed, s.top_k, 0.25)
    assert hit > 0.6, hit  # a clear majority of routed picks from a quarter of the experts
    assert abs(hit - expected_hit_rate(s.n_expert, s.top_k, 1.0, 0.25)) < 0.03  # the documented law holds
    assert abs(hit_rate(uniform, s.top_k, 0.25) - 0.25) < 0.03  # S = 0: no expert is special
    rates = [
        hit_rate(router_weights(s.d_model, s.n_expert, s.top_k, sk, rng), s.top_k, 0.25) for sk in (0.5, 2.0)
    ]
    assert rates[0] < hit < rates[1]


def test_file_hit_rate_reads_the_written_routers(tiny: dict[str, Path]) -> None:
    s = SHAPES[("qwen3next", "tiny")]
    rate = file_hit_rate(str(tiny["qwen3next"]), 0.25)
    assert abs(rate - expected_hit_rate(s.n_expert, s.top_k, 1.0, 0.25)) < 0.05
    assert GGUFFile(tiny["qwen3next"]).get("strata.synth.router_skew") == pytest.approx(1.0)


# ---------------------------------------------------------------- CLI


def test_cli_writes_and_reports(
    tmp_path: Path, qwen3_tokenizer_dir: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "cli.gguf"
    rc = main(
        [
            "synth",
            "--arch",
            "qwen3next",
            "--shape",
            "tiny",
            "--quant",
            "q8_0",
            "--router-skew",
            "0.5",
            "--tokenizer",
            str(qwen3_tokenizer_dir),
            "-o",
            str(out),
        ]
    )
    assert rc == 0 and out.is_file()
    assert "GB/s" in capsys.readouterr().out
    assert GGUFFile(out).architecture == "qwen3next"


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--shape", "huge"], "--shape='huge'"),
        (["--arch", "qwen3moe", "--shape", "80b-a3b"], "not a qwen3moe shape"),
        (["--quant", "q9_k"], "--quant='q9_k'"),
        (["--output-quant", "nope"], "--output-quant='nope'"),
        (["--router-skew", "-1"], "--router-skew"),
    ],
)
def test_cli_bad_flags_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture, args: list[str], needle: str
) -> None:
    assert main(["synth", *args, "-o", str(tmp_path / "x.gguf")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0] and not (tmp_path / "x.gguf").exists()


def test_cli_unwritable_and_no_space(
    tmp_path: Path, qwen3_tokenizer_dir: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    tok = ["--tokenizer", str(qwen3_tokenizer_dir)]
    assert main(["synth", *tok, "-o", str(tmp_path / "missing" / "x.gguf")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "does not exist" in err[0]

    from strata.synth import writer

    monkeypatch.setattr(
        writer.shutil, "disk_usage", lambda _: SimpleNamespace(total=10**12, used=10**12, free=10**6)
    )
    assert main(["synth", *tok, "--shape", "30b-a3b", "-o", str(tmp_path / "big.gguf")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    need = sum(-(-t.nbytes // 32) * 32 for t in tensor_plan(SHAPES[("qwen3moe", "30b-a3b")], Q.Q4_K, Q.Q4_K))
    assert (
        len(err) == 1
        and "not enough disk space" in err[0]
        and f"{need + writer.HEADER_BUDGET:,} bytes" in err[0]
    )
    assert not list(tmp_path.glob("big.gguf*"))
