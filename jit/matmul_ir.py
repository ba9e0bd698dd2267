"""IR for y[n_tok, rows] = x[n_tok, cols] . W^T with W quantized: one module per quant type.

Legend: R = weight rows (outputs), C = cols, N = tokens, B = blocks per row, RT x TT = a tile of
rows x tokens whose accumulators stay in registers.

Each tile walks the blocks of its RT rows once; a block is decoded into registers (formats.py)
and multiplied into the TT tokens' accumulators, so the decode cost is shared by TT tokens and the
x loads by RT rows. Every (row, token) accumulator sees the same sequence of FMAs whatever tile
computes it, so y[t, r] is bit-identical for any token count, tile shape or split of the rows
among threads: batch == solo and chunked == one-shot hold exactly.

Exported as qmm_<type> (qmm_q4_k, ...):
    void qmm(i8* w, i64 row_bytes, float* x, i64 ldx, i64 n_tok, float* y, i64 ldy, i64 r0, i64 r1)
computes y[t, r] (row stride ldy) for r in [r0, r1) and every token t (x row stride ldx).
"""

from __future__ import annotations

from dataclasses import dataclass

from llvmlite import ir

from strata.jit.formats import Ctx, Format
from strata.jit.host import Host
from strata.jit.irutil import F32, I64, P8, PF32, VOID, c64, fma, hsum, lanes, loop, vec

QMM_ARGS = (P8, I64, PF32, I64, I64, PF32, I64, I64, I64)


@dataclass(frozen=True, slots=True)
class Tiling:
    acc: int  # floats per accumulator vector (a multiple of the host's lanes, dividing 32)
    rows: int  # RT: rows per tile
    toks: int  # TT: tokens per tile

    @classmethod
    def for_host(cls, host: Host) -> Tiling:
        # Measured on znver4, Q4_1 6144 x 1152 (GMAC/s, one thread): AVX-512 2x8 tiles 44 at 8-64
        # tokens (4x4: 33, 3x8: 37, 2x12: 36), 14.5 at one token (all shapes alike); with AVX-512
        # turned off (AVX2, 16 registers) 2x4 tiles 25.6 at 64 tokens (2x2: 18.5, 4x1: 9).
        if host.lanes >= 16:
            return cls(acc=16, rows=2, toks=8)
        return cls(acc=8, rows=2, toks=4)

    @property
    def key(self) -> str:
        return f"a{self.acc}r{self.rows}t{self.toks}"


def ctx_for(b: ir.IRBuilder, host: Host) -> Ctx:
    shuffle = "avx2" if host.has("avx2") else "ssse3" if host.has("ssse3") else ""
    return Ctx(
        b,
        f16c=host.has("f16c"),
        shuffle=shuffle if host.x86 else "",
        permute=host.x86 and host.has("avx512f"),
    )


def _tile(mod: ir.Module, fmt: Format, host: Host, tl: Tiling, rt: int, tt: int) -> ir.Function:
    """void tile(i8* w_row, i64 row_bytes, float* x_tok, i64 ldx, float* y_tok_row, i64 ldy, i64 nb)."""
    fn = ir.Function(mod, ir.FunctionType(VOID, [P8, I64, PF32, I64, PF32, I64, I64]), f"tile{rt}x{tt}")
    fn.linkage = "internal"
    w, row_bytes, x, ldx, y, ldy, nb = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    c = ctx_for(b, host)
    acc_t = vec(F32, tl.acc)
    accs = [[b.alloca(acc_t) for _ in range(tt)] for _ in range(rt)]  # promoted to registers by SROA
    for row in accs:
        for a in row:
            b.store(ir.Constant(acc_t, None), a)  # zeroinitializer
    rows = [b.gep(w, [b.mul(row_bytes, c64(i))]) for i in range(rt)]
    toks = [b.gep(x, [b.mul(ldx, c64(t))]) for t in range(tt)]
    with loop(b, c64(0), nb, 1) as blk:
        blocks = [b.gep(r, [b.mul(blk, c64(fmt.size))]) for r in rows]
        prep = [fmt.prepare(c, p) for p in blocks]
        for j in range(fmt.subs):
            wv = [fmt.sub(c, p, s, j) for p, s in zip(blocks, prep)]  # RT x <32 x float>
            col = b.add(b.mul(blk, c64(fmt.block)), c64(32 * j))
            for t in range(tt):
                xv = b.load(b.bitcast(b.gep(toks[t], [col]), vec(F32, 32).as_pointer()), align=4)
                for k in range(0, 32, tl.acc):
                    xk = lanes(b, xv, k, tl.acc)
                    for i in range(rt):
                        b.store(fma(b, lanes(b, wv[i], k, tl.acc), xk, b.load(accs[i][t])), accs[i][t])
    for i in range(rt):
        for t in range(tt):
            b.store(hsum(b, b.load(accs[i][t])), b.gep(y, [b.add(b.mul(ldy, c64(t)), c64(i))]))
    b.ret_void()
    return fn


def build(fmt: Format, host: Host, tl: Tiling) -> ir.Module:
    """The module for one quant type: four tile shapes (full, and the ragged row/token tails) and
    the exported driver qmm_<type>."""
    mod = ir.Module(name=f"qmm_{fmt.qtype.name.lower()}")
    mod.triple = host.triple
    tiles = {(rt, tt): _tile(mod, fmt, host, tl, rt, tt) for rt in {tl.rows, 1} for tt in {tl.toks, 1}}
    fn = ir.Function(mod, ir.FunctionType(VOID, QMM_ARGS), mod.name)  # one engine holds every type: unique
    w, row_bytes, x, ldx, n_tok, y, ldy, r0, r1 = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    nb = b.udiv(row_bytes, c64(fmt.size))

    def rows_of(start: ir.Value, rt: int) -> ir.Value:
        with loop(b, start, r1, rt) as r:
            w_r = b.gep(w, [b.mul(r, row_bytes)])
            with loop(b, c64(0), n_tok, tl.toks) as t:
                _call(b, tiles[rt, tl.toks], w_r, row_bytes, x, ldx, y, ldy, r, t, nb)
            with loop(b, t, n_tok, 1) as t1:  # ragged token tail
                _call(b, tiles[rt, 1], w_r, row_bytes, x, ldx, y, ldy, r, t1, nb)
        return r

    rest = rows_of(r0, tl.rows)
    rows_of(rest, 1)  # ragged row tail
    b.ret_void()
    return mod


def _call(
    b: ir.IRBuilder,
    tile: ir.Function,
    w_r: ir.Value,
    row_bytes: ir.Value,
    x: ir.Value,
    ldx: ir.Value,
    y: ir.Value,
    ldy: ir.Value,
    r: ir.Value,
    t: ir.Value,
    nb: ir.Value,
) -> None:
    x_t = b.gep(x, [b.mul(t, ldx)])
    y_tr = b.gep(y, [b.add(b.mul(t, ldy), r)])
    b.call(tile, [w_r, row_bytes, x_t, ldx, y_tr, ldy, nb])
