"""CUDA source shared by every kernel: fp16 helpers, warp reductions and the GGUF block decoders.

Every quantized format is one `Q<type id>` struct with a single decoder, `deq8(row, c, v)`: the
float32 values of elements 8c..8c+7 of a row, read straight from the GGUF block bytes. GEMV, GEMM
and row gathers are templates over that one function, so a format is written once and every kernel
reads it the same way. Decoders round exactly as `strata.quants` does (explicit `__fmul_rn` and
friends: no FMA contraction), so dequantization is bit-exact with the numpy reference.

Sources are plain strings compiled by NVRTC with no headers (fp16 through PTX `cvt`), so they build
anywhere cupy runs. Type ids are ggml's (`GGMLQuantizationType`).
"""

from __future__ import annotations

from gguf.constants import GGMLQuantizationType as T

# The formats the GPU kernels read directly; anything else is refused at load with this list.
GPU_QTYPES: frozenset[T] = frozenset(
    {
        T.F32,
        T.F16,
        T.BF16,
        T.Q4_0,
        T.Q4_1,
        T.Q5_0,
        T.Q5_1,
        T.Q8_0,
        T.Q4_K,
        T.Q5_K,
        T.Q6_K,
        T.IQ4_NL,
        T.IQ4_XS,
    }
)

HEADER = r"""
typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef long long i64;
#define INFINITY __int_as_float(0x7f800000)
// int8 KV: scales per head row (strata.runtime.kvcache.group_of: 32 dims a scale, the whole head below 32)
#define Q8_GROUP(HD) ((HD) >= 32 ? 32 : (HD))
#define Q8_GROUPS(HD) ((HD) / Q8_GROUP(HD))

__device__ __forceinline__ float h2f(u16 h) {
  float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f;
}
__device__ __forceinline__ u16 f2h(float f) {
  u16 h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h;
}
// two floats rounded to fp16 and packed (lo in the low half) by one cvt: the GEMMs pack every operand so
__device__ __forceinline__ u32 pack2(float lo, float hi) {
  u32 h; asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(h) : "f"(hi), "f"(lo)); return h;
}
__device__ __forceinline__ float bf2f(u16 b) { return __uint_as_float(((u32)b) << 16); }
__device__ __forceinline__ u16 ld16(const u8* p) { return *(const u16*)p; }
__device__ __forceinline__ u32 ld32(const u8* p) { return *(const u32*)p; }
__device__ __forceinline__ float ldh(const u8* p) { return h2f(ld16(p)); }
// byte i of w (0..255) as a float, exactly: the byte under the exponent of 2^23 by one byte permute, minus
// 2^23. A plain int-to-float conversion issues at a quarter of the FMA rate, and the 4-bit decoders do
// one per weight.
__device__ __forceinline__ float byte_f(u32 w, int i) {
  u32 r; asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(w), "r"(0x4B000000u), "r"(0x7540u + i));
  return __uint_as_float(r) - 8388608.0f;
}
// signed byte i of w (an int8 code) as a float, exactly: the code + 128 under the exponent of 2^23, minus
// 2^23 + 128 (byte_f's permute, on the codes' sign bits flipped)
__device__ __forceinline__ float code_f(u32 w, int i) {
  u32 r; asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(w ^ 0x80808080u), "r"(0x4B000000u), "r"(0x7540u + i));
  return __uint_as_float(r) - 8388736.0f;
}
// cp.async: global to shared memory copies that land while the issuing threads go on (device memory only);
// a thread's copies commit as a group, and wait_group<N> waits until at most N of its groups are in flight
__device__ __forceinline__ u32 smem_addr(const void* p) {
  unsigned long long a; asm("cvta.to.shared.u64 %0, %1;" : "=l"(a) : "l"(p)); return (u32)a;
}
__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(smem_addr(dst)), "l"(src));
}
__device__ __forceinline__ void cp_async4(void* dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" :: "r"(smem_addr(dst)), "l"(src));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" :: "n"(N));
}
// tensor cores (flash_attn, attn_decode): fp16 operands, fp32 accumulators; fragments from shared memory
__device__ __forceinline__ void mma16816(float* c, const u32* a, const u32* b) {
  asm volatile(
    "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
    : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
    : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// flash_attn's and attn_decode's online softmax over a warp's tile of mma scores s [NT 8-key tiles][4] (the
// C fragments' rows g and g + 8; masked keys -INFINITY; base 2): the rows' running max and sum (mrow, lrow)
// move on to the tile's, s becomes the probabilities, and alpha gets the factor the rows' outputs take
template <int NT>
__device__ __forceinline__ void softmax_tile(float (&s)[NT][4], float* mrow, float* lrow, float* alpha) {
  float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int nt = 0; nt < NT; nt++)
#pragma unroll
    for (int e = 0; e < 4; e++) mx[e >> 1] = fmaxf(mx[e >> 1], s[nt][e]);
#pragma unroll
  for (int r = 0; r < 2; r++) {
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
    const float mnew = fmaxf(mrow[r], mx[r]);
    alpha[r] = mnew == -INFINITY ? 1.f : exp2f(mrow[r] - mnew);
    mrow[r] = mnew;
    lrow[r] *= alpha[r];
  }
#pragma unroll
  for (int nt = 0; nt < NT; nt++)
#pragma unroll
    for (int e = 0; e < 4; e++) {
      const float mr = mrow[e >> 1];
      const float p = mr == -INFINITY ? 0.f : exp2f(s[nt][e] - mr);
      s[nt][e] = p;
      lrow[e >> 1] += p;
    }
}

// the same at k = 8 (attn_decode's 8-key warps: P times V)
__device__ __forceinline__ void mma1688(float* c, const u32* a, u32 b) {
  asm volatile(
    "mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};"
    : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
    : "r"(a[0]), "r"(a[1]), "r"(b));
}

// ldmatrix: four 8x8 b16 matrices, rows from lanes 0-7, 8-15, 16-23, 24-31 (each lane one row's address);
// .trans gives each lane a column instead of a row
__device__ __forceinline__ void ldsm_x4(u32* r, const u16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldsm_x4_trans(u32* r, const u16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldsm_x2(u32* r, const u16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(smem_addr(p)));
}
// q . k of a 16-row query tile (qs: this lane's ldmatrix row of the padded fp16 queries) against NT 8-key
// n-tiles of fp16 K rows (k0: the first key's row, pitch LK u16s), flash_attn's and attn_decode's scores: in
// 32-dim passes one ldmatrix.x4 of K serves both 16-dim steps, the first step into s and the second into s2
// (s itself for one chain of mmas; a second array halves the chain); 16-dim heads take one step into s
template <int HD, int LK, int NT>
__device__ __forceinline__ void qk_tile(float (&s)[NT][4], float (&s2)[NT][4], const u16* qs, const u16* k0,
                                        int lane) {
  if constexpr (HD % 32 == 0) {
#pragma unroll
    for (int kp = 0; kp < HD / 32; kp++) {
      u32 qa0[4], qa1[4];
      ldsm_x4(qa0, qs + kp * 32);
      ldsm_x4(qa1, qs + kp * 32 + 16);
#pragma unroll
      for (int nt = 0; nt < NT; nt++) {
        u32 b[4];
        ldsm_x4(b, k0 + (nt * 8 + (lane & 7)) * LK + kp * 32 + (lane >> 3) * 8);
        mma16816(s[nt], qa0, b);
        mma16816(s2[nt], qa1, b + 2);
      }
    }
  } else {
    u32 qa[4];
    ldsm_x4(qa, qs);
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
      u32 b[2];
      ldsm_x2(b, k0 + (nt * 8 + (lane & 7)) * LK + ((lane >> 3) & 1) * 8);
      mma16816(s[nt], qa, b);
    }
  }
}
// 8 int8 codes times their scale, rounded to fp16 and packed: the same bits as f2h((float)code * scale), by
// code_f's byte permute and one cvt per two values, where a plain int-to-float and a float-to-half cvt each
// issue at a sixteenth of the FMA rate
__device__ __forceinline__ uint4 dequant8(uint2 w, float s) {
  const u32 ws[2] = {w.x, w.y};
  u32 h[4];
#pragma unroll
  for (int i = 0; i < 4; i++)
    h[i] = pack2(code_f(ws[i >> 1], 2 * (i & 1)) * s, code_f(ws[i >> 1], 2 * (i & 1) + 1) * s);
  return make_uint4(h[0], h[1], h[2], h[3]);
}

// 4 bytes from a 2-byte aligned address (Q6_K/Q8_0/Q5_0 blocks are only 2-aligned)
__device__ __forceinline__ u32 ld32a2(const u8* p) { return (u32)ld16(p) | ((u32)ld16(p + 2) << 16); }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float silu(float x) { return x / (1.0f + expf(-x)); }

// Row r of W0 | W1 | W2 read as one matrix (q|k|v): rows below r1 from W0, below r2 from W1, the rest from W2
__device__ __forceinline__ const u8* cat_row(const u8* W0, const u8* W1, const u8* W2, int r1, int r2,
                                             i64 row_bytes, int r) {
  return r < r1 ? W0 + (i64)r * row_bytes
                : r < r2 ? W1 + (i64)(r - r1) * row_bytes : W2 + (i64)(r - r2) * row_bytes;
}

// The split-K epilogue of the decode products (8 warps, `split` of them per row r): each warp's partial
// dots for its NT tokens meet in part, and the row's first warp writes y[t0 + t, r] (+)= sum (* scale[t]).
// Every thread of the block calls it (two barriers).
template <int NT>
__device__ __forceinline__ void split_store(const float* acc, float (*part)[NT], int split, int r, int rows,
                                            int n, const float* scale, float* y, int t0, int ldy,
                                            int accumulate) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
  for (int t = 0; t < NT; t++) {
    const float s = warp_sum(acc[t]);
    if (lane == 0) part[warp][t] = s;
  }
  __syncthreads();
  if (warp % split == 0 && lane < n && r < rows) {
    float s = 0.f;
    for (int j = 0; j < split; j++) s += part[warp + j][lane];
    if (scale != nullptr) s *= scale[lane];
    float* o = y + (i64)(t0 + lane) * ldy + r;
    *o = accumulate ? *o + s : s;
  }
  __syncthreads();
}

typedef signed char i8;
// sum of the four signed byte products of a and b, plus c
__device__ __forceinline__ int dp4a(int a, int b, int c) {
  int d; asm("dp4a.s32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c)); return d;
}
__device__ __forceinline__ void prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];" :: "l"(p));
}

// Inputs as int8 codes per group of 32 (mmvq.py): 4 consecutive lanes hold a group, 8 values each (lane & 3
// says which 8). Writes this lane's 8 codes at q (8-aligned) and, from the group's first lane, (d, d * sum of
// the codes) at ds, with d = max|v| / 127 and code = rint(v / d). q == nullptr: takes part in the shuffles
// and writes nothing. Every lane of the warp must call it.
__device__ __forceinline__ void q8_store(const float* v, u32* q, float2* ds) {
  float amax = 0.f;
#pragma unroll
  for (int i = 0; i < 8; i++) amax = fmaxf(amax, fabsf(v[i]));
  amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
  amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
  const float d = amax / 127.0f;
  u32 w0 = 0u, w1 = 0u;
  int sum = 0;
#pragma unroll
  for (int i = 0; i < 8; i++) {
    const int c = amax > 0.f ? __float2int_rn(v[i] / d) : 0;
    sum += c;
    if (i < 4) w0 |= (u32)(c & 0xFF) << (8 * i); else w1 |= (u32)(c & 0xFF) << (8 * (i - 4));
  }
  sum += __shfl_xor_sync(0xffffffffu, sum, 1);
  sum += __shfl_xor_sync(0xffffffffu, sum, 2);
  if (q != nullptr) {
    *(uint2*)q = make_uint2(w0, w1);
    if ((threadIdx.x & 3) == 0) *ds = make_float2(d, d * (float)sum);
  }
}

// scale = d * code and value = scale * q (- min), each rounded once, as the numpy reference does
__device__ __forceinline__ float mul(float a, float b) { return __fmul_rn(a, b); }

template <int QT> struct Q;

template <> struct Q<0> {  // F32
  static __device__ __forceinline__ void deq8(const u8* row, int c, float* v) {
    const float4* p = (const float4*)(row + 32 * c);
    float4 a = p[0], b = p[1];
    v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w; v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
  }
};
template <> struct Q<1> {  // F16
  static __device__ __forceinline__ void deq8(const u8* row, int c, float* v) {
    uint4 w = *(const uint4*)(row + 16 * c);
    u32 q[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int i = 0; i < 4; i++) { v[2 * i] = h2f(q[i] & 0xFFFF); v[2 * i + 1] = h2f(q[i] >> 16); }
  }
};
template <> struct Q<30> {  // BF16
  static __device__ __forceinline__ void deq8(const u8* row, int c, float* v) {
    uint4 w = *(const uint4*)(row + 16 * c);
    u32 q[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int i = 0; i < 4; i++) { v[2 * i] = bf2f(q[i] & 0xFFFF); v[2 * i + 1] = bf2f(q[i] >> 16); }
  }
};

// Legacy 32-element blocks: element j < 16 is the low nibble of qs[j], j >= 16 the high nibble of qs[j-16].
template <> struct Q<2> {  // Q4_0: d | qs[16]; (q - 8) * d
  static __device__ __forceinline__ void deq8(const u8* row, int c, float* v) {
    const u8* b = row + (c >> 2) * 18;
    const int j = (c & 3) * 8;
    const float d = ldh(b);
    const int sh = j >= 16 ? 4 : 0;
    const u32 lo = (ld32a2(b + 2 + (j & 15)) >> sh) & 0x0F0F0F0Fu,
              hi = (ld32a2(b + 6 + (j & 15)) >> sh) & 0x0F0F0F0Fu;
#pragma unroll
    for (int i = 0; i < 4; i++) {  // q - 8 is exact in float
      v[i] = mul(byte_f(lo, i) - 8.0f, d);
      v[i + 4] = mul(byte_f(hi, i) - 8.0f, d);
    }
  }
};
template <> struct Q<3> {  // Q4_1: d | m | qs[16]; q * d + m
  static __device__ __forceinline__ void deq8(const u8* row, int c, float* v) {
    const u8* b = row + (c >> 2) * 20;
    const int j = (c & 3) * 8;
    const float d = ldh(b), m = ldh(b + 2);
    const int sh = j >= 16 ? 4 : 0;
    const u32 lo = (ld32(b + 4 + (j & 15)) >> sh) & 0x0F0F0F0Fu,
              hi = (ld32(b + 8 + (j & 15)) >> sh) & 0x0F0F0F0Fu;
#pragma unroll
    for (int i = 0; i < 4; i++) {
      v[i] = __fadd_rn(mul(byte_f(lo, i), d), m);
      v[i + 4] = __fadd_rn(mul(byte_f(hi, i), d), m);
    }
  }
};
template <> struct Q<6> {  // Q5_0: d | qh (u32, bit j = bit 4 of element j) | qs[16]; (q - 16) * d
  static __device__ __forceinline__ void deq8(const u8* row, int c, float* v) {
    const u8* b = row + (c >> 2) * 22;
    const int j = (c & 3) * 8;
    const float d = ldh(b);
    const u32 qh = ld32a2(b + 2);
    const u32 lo = ld32a2(b + 6 + (j & 15)), hi = ld32a2(b + 10 + (j & 15));
    const int sh = j >= 16 ? 4 : 0;
#pragma unroll
    for (int i = 0; i < 4; i++) {
      int q0 = (int)(((lo >> (8 * i + sh)) & 15) | (((qh >> (j + i)) & 1) << 4));
      int q1 = (int)(((hi >> (8 * i + sh)) & 15) | (((qh >> (j + i + 4)) & 1) << 4));
      v[i] = mul((float)(q0 - 16), d);
      v[i + 4] = mul((float)(q1 - 16), d);
    }
  }
};
template <> struct Q<7> {  // Q5_1: d | m | qh | qs[16]; q * d + m
  static __device__ __forceinline__ void deq8(const u8* row, int c, float* v) {
    const u8* b = row + (c >> 2) * 24;
    const int j = (c & 3) * 8;
    const float d = ldh(b), m = ldh(b + 2);
    const u32 qh = ld32(b + 4);
    const u32 lo = ld32(b + 8 + (j & 15)), hi = ld32(b + 12 + (j & 15));
    const int sh = j >= 16 ? 4 : 0;
#pragma unroll
    for (int i = 0; i < 4; i++) {
      u32 q0 = ((lo >> (8 * i + sh)) & 15) | (((qh >> (j + i)) & 1) << 4);
      u32 q1 = ((hi >> (8 * i + sh)) & 15) | (((qh >> (j + i + 4)) & 1) << 4);
      v[i] = __fadd_rn(mul((float)q0, d), m);
      v[i + 4] = __fadd_rn(mul((float)q1, d), m);
    }
  }
};
template <> struct Q<8> {  // Q8_0: d | qs[32] int8
  static __device__ __forceinline__ void deq8(const u8* row, int c, float* v) {
    const u8* b = row + (c >> 2) * 34;
    const float d = ldh(b);
    const u8* q = b + 2 + (c & 3) * 8;
    const u32 w0 = ld32a2(q), w1 = ld32a2(q + 4);
#pragma unroll
    for (int i = 0; i < 4; i++) {
      v[i] = mul((float)(signed char)((w0 >> (8 * i)) & 0xFF), d);
      v[i + 4] = mul((float)(signed char)((w1 >> (8 * i)) & 0xFF), d);
    }
  }
};

// K-quant 6-bit (scale, min) pair j of the 12-byte field (ggml get_scale_min_k4)
__device__ __forceinline__ void scale_min_k4(const u8* s, int j, int* sc, int* mn) {
  if (j < 4) { *sc = s[j] & 63; *mn = s[j + 4] & 63; }
  else { *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4); *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4); }
}

template <> struct Q<12> {  // Q4_K: d | dmin | scales[12] | qs[128];
                            // 4 groups of 64 = (low, high) nibbles of 32 bytes
  static __device__ __forceinline__ void deq8(const u8* row, int c, float* v) {
    const u8* b = row + (c >> 5) * 144;
    const int e = (c & 31) * 8, g = e >> 6, w = e & 63;
    int sc, mn;
    scale_min_k4(b + 4, e >> 5, &sc, &mn);
    const float dl = mul(ldh(b), (float)sc), ml = mul(ldh(b + 2), (float)mn);
    const int sh = w >= 32 ? 4 : 0;
    const u32 lo = (ld32(b + 16 + 32 * g + (w & 31)) >> sh) & 0x0F0F0F0Fu;
    const u32 hi = (ld32(b + 20 + 32 * g + (w & 31)) >> sh) & 0x0F0F0F0Fu;
#pragma unroll
    for (int i = 0; i < 4; i++) {
      v[i] = __fsub_rn(mul(byte_f(lo, i), dl), ml);
      v[i + 4] = __fsub_rn(mul(byte_f(hi, i), dl), ml);
    }
  }
};
template <> struct Q<13> {  // Q5_K: d | dmin | scales[12] | qh[32] | qs[128]; bit (e/32) of qh[e%32] is bit 4
  static __device__ __forceinline__ void deq8(const u8* row, int c, float* v) {
    const u8* b = row + (c >> 5) * 176;
    const int e = (c & 31) * 8, g = e >> 6, w = e & 63, l = w & 31, s = e >> 5;
    int sc, mn;
    scale_min_k4(b + 4, s, &sc, &mn);
    const float dl = mul(ldh(b), (float)sc), ml = mul(ldh(b + 2), (float)mn);
    const u32 lo = ld32(b + 48 + 32 * g + l), hi = ld32(b + 52 + 32 * g + l);
    const u32 h0 = ld32(b + 16 + l), h1 = ld32(b + 20 + l);
    const int sh = w >= 32 ? 4 : 0;
#pragma unroll
    for (int i = 0; i < 4; i++) {
      u32 q0 = ((lo >> (8 * i + sh)) & 15) | (((h0 >> (8 * i + s)) & 1) << 4);
      u32 q1 = ((hi >> (8 * i + sh)) & 15) | (((h1 >> (8 * i + s)) & 1) << 4);
      v[i] = __fsub_rn(mul((float)q0, dl), ml);
      v[i + 4] = __fsub_rn(mul((float)q1, dl), ml);
    }
  }
};
template <> struct Q<14> {  // Q6_K: ql[128] | qh[64] | scales[16] int8 | d; halves of 128, 4 runs of 32
  static __device__ __forceinline__ void deq8(const u8* row, int c, float* v) {
    const u8* b = row + (c >> 5) * 210;
    const int e = (c & 31) * 8, h = e >> 7, w = e & 127, s = w >> 5, l = w & 31;
    const float dsc = mul(ldh(b + 208), (float)(signed char)b[192 + 8 * h + 2 * s + (l >> 4)]);
    const u8* ql = b + 64 * h + 32 * (s & 1) + l;
    const u8* qh = b + 128 + 32 * h + l;
    const u32 l0 = ld32a2(ql), l1 = ld32a2(ql + 4), q0 = ld32a2(qh), q1 = ld32a2(qh + 4);
    const int sh = (s >> 1) * 4;
#pragma unroll
    for (int i = 0; i < 4; i++) {
      int a = (int)(((l0 >> (8 * i + sh)) & 15) | (((q0 >> (8 * i + 2 * s)) & 3) << 4)) - 32;
      int z = (int)(((l1 >> (8 * i + sh)) & 15) | (((q1 >> (8 * i + 2 * s)) & 3) << 4)) - 32;
      v[i] = mul((float)a, dsc);
      v[i + 4] = mul((float)z, dsc);
    }
  }
};

__constant__ signed char KV_IQ4NL[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                         1,    13,   25,  38,  53,  69,  89,  113};

template <> struct Q<20> {  // IQ4_NL: d | qs[16]; d * kvalues[nibble]
  static __device__ __forceinline__ void deq8(const u8* row, int c, float* v) {
    const u8* b = row + (c >> 2) * 18;
    const int j = (c & 3) * 8;
    const float d = ldh(b);
    const u32 lo = ld32a2(b + 2 + (j & 15)), hi = ld32a2(b + 6 + (j & 15));
    const int sh = j >= 16 ? 4 : 0;
#pragma unroll
    for (int i = 0; i < 4; i++) {
      v[i] = mul((float)KV_IQ4NL[(lo >> (8 * i + sh)) & 15], d);
      v[i + 4] = mul((float)KV_IQ4NL[(hi >> (8 * i + sh)) & 15], d);
    }
  }
};
template <> struct Q<23> {  // IQ4_XS: d | scales_h u16 | scales_l[4] | qs[128]; 8 sub-blocks of 32 as IQ4_NL
  static __device__ __forceinline__ void deq8(const u8* row, int c, float* v) {
    const u8* b = row + (c >> 5) * 136;
    const int e = (c & 31) * 8, ib = e >> 5, j = e & 31;
    const int ls = ((b[4 + (ib >> 1)] >> (4 * (ib & 1))) & 15) | (((ld16(b + 2) >> (2 * ib)) & 3) << 4);
    const float dl = mul(ldh(b), (float)(ls - 32));
    const u32 lo = ld32(b + 8 + 16 * ib + (j & 15)), hi = ld32(b + 12 + 16 * ib + (j & 15));
    const int sh = j >= 16 ? 4 : 0;
#pragma unroll
    for (int i = 0; i < 4; i++) {
      v[i] = mul((float)KV_IQ4NL[(lo >> (8 * i + sh)) & 15], dl);
      v[i + 4] = mul((float)KV_IQ4NL[(hi >> (8 * i + sh)) & 15], dl);
    }
  }
};
"""
