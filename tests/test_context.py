"""The context chosen when none is asked for (strata.tiers.context): the trained one when its KV fits,
else the largest that does, and a line that says why."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from strata.engine import Engine
from strata.tiers import context
from strata.tiers.budget import GIB, MIB

# the Qwen3-Next-80B shape: 12 attention layers x 2 KV heads x 256 dims, K and V in f16
KV_80B = 2 * 12 * 2 * 256 * 2
EXPERTS_80B = int(40.5 * GIB)


def test_gpu_serves_the_trained_context_beside_every_expert() -> None:
    c = context.on_gpu(262_144, KV_80B, 1, room=60 * GIB, experts=EXPERTS_80B)
    assert c.n_ctx == 262_144 and "(the trained context)" in c.line and "beside every expert" in c.line


def test_gpu_keeps_a_quarter_of_the_room_for_kv_when_experts_do_not_fit() -> None:
    room = int(18.6 * GIB)  # a 24 GB card after the 80B's dense part
    c = context.on_gpu(262_144, KV_80B, 4, room=room, experts=EXPERTS_80B)
    assert c.n_ctx == int(0.25 * room) // (4 * KV_80B) // 1024 * 1024 == 50_176
    assert "of the trained 262,144" in c.line and "24.0 GiB" in c.line and "--ctx-size" in c.line
    one = context.on_gpu(262_144, KV_80B, 1, room=room, experts=EXPERTS_80B)  # 6 GiB: more than the quarter
    assert one.n_ctx == 202_752
    wide = context.on_gpu(262_144, KV_80B, 1, room=30 * GIB, experts=EXPERTS_80B)  # a 32 GB card: within it
    assert wide.n_ctx == 262_144 and "within 25%" in wide.line


def test_gpu_takes_what_all_experts_leave_when_that_is_more() -> None:
    c = context.on_gpu(262_144, KV_80B, 4, room=60 * GIB, experts=EXPERTS_80B)  # 19.5 GiB beside them > 15
    assert c.n_ctx == (60 * GIB - EXPERTS_80B) // (4 * KV_80B) // 1024 * 1024 == 212_992


def test_never_below_the_floor() -> None:
    assert context.on_gpu(262_144, KV_80B, 4, room=64 * MIB, experts=EXPERTS_80B).n_ctx == context.FLOOR
    assert (
        context.on_gpu(2048, KV_80B, 4, room=64 * MIB, experts=EXPERTS_80B).n_ctx == 2048
    )  # trained is smaller


def test_cpu_fits_the_full_context_in_half_the_free_ram() -> None:
    assert context.on_cpu(262_144, KV_80B, 1, available=32 * GIB).n_ctx == 262_144
    c = context.on_cpu(262_144, KV_80B, 4, available=32 * GIB)
    assert c.n_ctx == 16 * GIB // (4 * KV_80B) // 1024 * 1024 and "--kv-type int8" in c.line


def test_a_kv_window_leaves_the_context_to_the_host_ram() -> None:
    """--kv-resident: the window is a fixed part of the VRAM plan; the trained context is served when the rest
    of its KV fits in half the RAM, else the window plus what does (whole 1,024s)."""
    per, window = 12 * 1024, 34_112
    full = context.on_window(262_144, per, 1, window, 64 * GIB)
    assert full.n_ctx == 262_144 and "in RAM when full" in full.line
    cut = context.on_window(262_144, per, 1, window, GIB)  # half a GiB for the host's cells: ~43k of them
    assert window < cut.n_ctx < 262_144 and "of RAM" in cut.line
    assert (cut.n_ctx - window) * per <= GIB // 2 + 1024 * per


def test_engine_chooses_on_load(smollm2_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import psutil

    assert (
        Engine.load(smollm2_path, device="cpu").n_ctx == 8192
    )  # SmolLM2's trained context: 360 MiB of f32 KV
    assert Engine.load(smollm2_path, device="cpu", n_ctx=1000).n_ctx == 1000  # asked for: kept
    monkeypatch.setattr(psutil, "virtual_memory", lambda: SimpleNamespace(available=250 * MIB))
    assert Engine.load(smollm2_path, device="cpu").n_ctx == context.FLOOR
    # int8 cells: 12.7 KiB a token, so half of 250 MiB holds 8,192 positions (f32: 45 KiB, 2,844)
    assert Engine.load(smollm2_path, device="cpu", kv_type="int8").n_ctx == 8192


def test_planner_shows_the_context_and_the_kv_per_cell_type(
    tiny_qwen3moe: dict, capsys: pytest.CaptureFixture
) -> None:
    import json

    from strata.cli import main
    from strata.gguf import GGUFFile
    from strata.runtime.kvcache import KVCache, KVType

    path = str(tiny_qwen3moe["f32"])
    g = GGUFFile(path)
    n_layer, n_kv = int(g.arch_get("block_count")), int(g.arch_get("attention.head_count_kv"))
    hd = int(g.arch_get("attention.key_length"))
    assert main(["plan", path, "--vram-gib", "2", "--json"]) == 0
    p = json.loads(capsys.readouterr().out)
    assert (
        p["n_ctx"] == p["n_ctx_trained"]
        and p["kv_type"] == "f16"
        and "(the trained context)" in p["context_line"]
    )
    for kind in (KVType.F16, KVType.INT8):
        assert p["kv_bytes_per_token"][kind] == KVCache.bytes_per_token(kind, n_layer, n_kv, hd)
        assert p["context_allowed"][kind] == p["n_ctx_trained"]  # a tiny model's KV fits any way
    assert main(["plan", path, "--vram-gib", "2", "--ctx-size", "512", "--kv-type", "int8", "--json"]) == 0
    p = json.loads(capsys.readouterr().out)
    assert p["n_ctx"] == 512 and p["context_line"] is None and p["kv_type"] == "int8"
    assert main(["plan", path, "--vram-gib", "2"]) == 0
    assert "KV in VRAM: f16" in capsys.readouterr().out


def test_a_cpu_context_ram_cannot_hold_is_refused(
    smollm2_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import psutil

    from strata.errors import ConfigError

    monkeypatch.setattr(psutil, "virtual_memory", lambda: SimpleNamespace(available=200 * MIB))
    with pytest.raises(ConfigError, match=r"n_ctx.*need 0\.4 GiB of f32 KV.*int8 KV: 0\.1 GiB"):
        Engine.load(smollm2_path, device="cpu", n_ctx=8192)
    assert Engine.load(smollm2_path, device="cpu", n_ctx=8192, kv_type="int8").n_ctx == 8192
