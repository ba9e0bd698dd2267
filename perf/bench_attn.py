"""The attention kernels alone at a model's attention shape (default the 80B's: 16 query heads, 2 kv heads,
head dim 256), against the context (issue 18): prefill's `flash_attn` for one chunk of queries at the end of
each context, per cell type and block size, in TFLOP/s; decode attention (split-K) for one row, in GB/s of
cells read. Not a test: prints a table and writes JSON.

    python perf/bench_attn.py [--contexts 4096,32768,131072,262144] [--chunk 4096] [--kv-types f16,int8]
                              [--warps 4,8] [--splits 64,128] [--no-flash | --no-decode] [--before DIR]
                              [--json OUT.json]

`--before` names a folder with copies of an earlier kernels/flash.py and kernels/attention.py (either): their
kernels run beside the current ones on the same cells in the same process, and each row gives both and the
largest difference of their outputs. Repeated, each folder's kernels run, labelled by the folder's name (they
compile against the current kernels/common.py).
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import math
from pathlib import Path
from types import ModuleType
from typing import Any


def _load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"{path.stem}_{path.parent.name}", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _smem(mod: ModuleType, hd: int, q8: bool, warps: int) -> int:
    try:
        return int(mod.flash_smem(hd, q8, warps))
    except TypeError:  # the kernel before its shared memory depended on the cells and the block
        return int(mod.flash_smem(hd))


def _time(cp: Any, fn: Any, min_s: float = 0.3) -> float:
    """Seconds a call, by CUDA events, after a warm-up: as many calls as fill min_s."""
    fn()
    cp.cuda.Device().synchronize()
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    reps = 1
    while True:
        start.record()
        for _ in range(reps):
            fn()
        stop.record()
        stop.synchronize()
        t = cp.cuda.get_elapsed_time(start, stop) / 1e3
        if t >= min_s or reps >= 1 << 12:
            return t / reps
        reps = max(reps * 2, int(reps * min_s / max(t, 1e-6)) + 1)


def _decode_name(mod: ModuleType, hd: int, q8: bool, h: int, kv: int) -> tuple[str, int]:
    """The decode kernel's name in a version of kernels/attention.py and the query heads a block takes (the
    versions before group blocks took one)."""
    if hasattr(mod, "group_heads"):
        gb = mod.group_heads(h, kv)
        return mod.decode_name(hd, q8, gb), gb
    return mod.decode_name(hd, q8), 1


def _merge_name(mod: ModuleType, hd: int) -> str:
    """The split-K merge's name: kernels/cells.py's, composed into attention.py's source (the versions before
    it defined it themselves)."""
    from strata.gpu.kernels import cells

    return str(getattr(mod, "merge_name", cells.merge_name)(hd))


def _decode(split: Any, launch: Any, merge: tuple[Any, ...]) -> None:
    """Split-K decode attention (a launch ready to go), then the merge of its partials."""
    split()
    launch(*merge)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--contexts", default="4096,32768,131072,262144")
    ap.add_argument("--chunk", type=int, default=4096)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=256)
    ap.add_argument("--kv-types", default="f16,int8")
    ap.add_argument("--warps", default="4,8")
    ap.add_argument(
        "--before",
        type=Path,
        action="append",
        default=[],
        help="a folder of other flash.py and attention.py to run beside (repeatable: each labelled by its "
        "folder's name, or 'before' when alone)",
    )
    ap.add_argument(
        "--splits", default=None, help="decode's split-K counts to time (default attention.SPLITS alone)"
    )
    ap.add_argument("--no-flash", action="store_true")
    ap.add_argument("--no-decode", action="store_true")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()

    import cupy as cp

    from strata.gpu.kernels import attention, flash
    from strata.gpu.layers import TAB
    from strata.gpu.runtime import NULL, Kernels, dev_ptr, f32, i32, i64, launch

    h, kv, hd, t = a.heads, a.kv_heads, a.head_dim, a.chunk
    warps = [] if a.no_flash else [int(w) for w in a.warps.split(",")]
    kinds = [k == "int8" for k in a.kv_types.split(",")]
    contexts = [int(c) for c in a.contexts.split(",")]
    label = {d: "before" if len(a.before) == 1 else d.name for d in a.before}
    mods = {"now": flash} | {label[d]: _load(d / "flash.py") for d in a.before if (d / "flash.py").exists()}
    amods = {"now": attention} | {
        label[d]: _load(d / "attention.py") for d in a.before if (d / "attention.py").exists()
    }
    kern = {
        name: Kernels(m.SOURCE, [m.flash_name(hd, q8, w) for q8 in kinds for w in warps])
        for name, m in mods.items()
    }
    dec = {
        name: Kernels(m.SOURCE, [_decode_name(m, hd, q8, h, kv)[0] for q8 in kinds] + [_merge_name(m, hd)])
        for name, m in amods.items()
    }
    ng = hd // min(hd, 32)
    scale = 1 / math.sqrt(hd)
    rows: list[dict[str, Any]] = []
    cp.random.seed(0)
    q = (cp.random.standard_normal((t, h * hd), dtype=cp.float32)).astype(cp.float32)
    splits = [int(z) for z in a.splits.split(",")] if a.splits else [attention.SPLITS]
    part = cp.empty((1, h, max(splits), hd + 2), cp.float32)
    for ctx in contexts:
        s = ctx
        n_past = s - t
        for q8 in kinds:
            if q8:
                kc = cp.random.randint(-127, 128, (kv, s, hd)).astype(cp.int8)
                vc = cp.random.randint(-127, 128, (kv, s, hd)).astype(cp.int8)
                ks = cp.random.uniform(0.004, 0.02, (kv, s, ng)).astype(cp.float32)
                vs = cp.random.uniform(0.004, 0.02, (kv, s, ng)).astype(cp.float32)
                scales = (ks.data.ptr, vs.data.ptr, s * ng)
                cell_bytes = 2 * kv * s * (hd + 4 * ng)
            else:
                kc = cp.random.standard_normal((kv, s, hd), dtype=cp.float32).astype(cp.float16)
                vc = cp.random.standard_normal((kv, s, hd), dtype=cp.float32).astype(cp.float16)
                ks = vs = None
                scales = (NULL, NULL, 0)
                cell_bytes = 2 * kv * s * hd * 2
            keys = t * n_past + t * (t + 1) // 2  # causal: query i sees n_past + i + 1 keys
            flops = 4 * h * hd * keys
            row: dict[str, Any] = {"context": ctx, "chunk": t, "kv_type": "int8" if q8 else "f16"}
            outs = {}
            for name, m in mods.items():
                for w in warps:
                    out = cp.empty((t, h * hd), cp.float32)

                    run = functools.partial(
                        launch,
                        kern[name][m.flash_name(hd, q8, w)],
                        (-(-t // (16 * w)), h),
                        32 * w,
                        (q, kc, vc, i64(s * hd), dev_ptr(scales[0]), dev_ptr(scales[1]), i64(scales[2]))
                        + (i32(t), i32(n_past), i32(h), i32(kv), f32(scale * 1.4426950408889634), out)
                        + (NULL, NULL, i64(0), NULL, NULL, i32(0)),
                        smem=_smem(m, hd, q8, w),
                    )
                    sec = _time(cp, run)
                    row[f"flash_{name}_w{w}_ms"] = round(sec * 1e3, 3)
                    row[f"flash_{name}_w{w}_tflops"] = round(flops / sec / 1e12, 1)
                    outs[(name, w)] = out
            for (name, w), o in outs.items():
                if (name, w) != ("now", warps[0]):
                    row[f"diff_{name}_w{w}"] = float(cp.abs(o - outs["now", warps[0]]).max())
            if not a.no_decode:
                tab = cp.zeros((1, TAB), cp.int64)
                kp, vp = (ks.data.ptr, vs.data.ptr) if q8 else (0, 0)
                tab[0, :9] = cp.asarray([kc.data.ptr, vc.data.ptr, s, s - 1, 0, 0, 0, kp, vp])
                douts = {}
                for name, m in amods.items():
                    for z in splits:
                        dout = douts[name, z] = cp.empty((1, h * hd), cp.float32)
                        args_d = (q[:1], tab, i32(TAB), i32(0), i32(h), i32(kv), f32(scale), dout, part)
                        merge_args = (part, i32(z), i32(h), dout)
                        merge = (dec[name][_merge_name(m, hd)], (h, 1), max(32, hd), merge_args)
                        name_d, gb = _decode_name(m, hd, q8, h, kv)
                        smem = m.decode_smem(hd, q8, gb) if hasattr(m, "decode_smem") else 0
                        threads = 32 * m.decode_warps(hd) if hasattr(m, "decode_warps") else 128
                        split = functools.partial(
                            launch, dec[name][name_d], (h // gb, 1, z), threads, (*args_d, i32(z)), smem=smem
                        )
                        sec = _time(cp, functools.partial(_decode, split, launch, merge))
                        row[f"decode_{name}_s{z}_us"] = round(sec * 1e6, 1)
                        row[f"decode_{name}_s{z}_gbps"] = round(cell_bytes / sec / 1e9, 1)
                ref_d = douts["now", splits[0]]
                for key, o in douts.items():
                    if key != ("now", splits[0]):
                        row[f"diff_decode_{key[0]}_s{key[1]}"] = float(cp.abs(o - ref_d).max())
            rows.append(row)
            print(json.dumps(row), flush=True)
            del kc, vc, ks, vs
    if a.json:
        device = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
        a.json.write_text(json.dumps({"device": device, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
