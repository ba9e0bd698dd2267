"""What a synthetic file holds: its tensors (names, shapes, ggml types, how to fill them) and its
metadata, laid out as llama.cpp's converter + llama-quantize write Qwen3-MoE and Qwen3-Next.

Shapes are numpy order (GGUF ne reversed): a matrix is [rows, cols], an expert tensor
[E, rows, cols]. Which tensors stay F32 follows llama-quantize: 1-D tensors, norms, the router
(ffn_gate_inp), the DeltaNet conv kernel, and ffn_gate_inp_shexp (ne [D, 1] has one real dim).
A type whose block does not divide a row falls back as llama-quantize's tensor_type_fallback does.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

import gguf
import numpy as np
from gguf.constants import GGML_QUANT_SIZES
from gguf.constants import GGMLQuantizationType as Q

from strata.gguf.names import Keys, T, tensor
from strata.synth.shapes import QWEN3NEXT, Shape

WEIGHT_STD = 0.02  # dequantized std of every projection, embedding and expert matrix but attn_output
NORM_STD = 0.02  # norms are 1 + N(0, NORM_STD), the attention's q/k norms QK_GAIN times that
# Random attention must not make every position alike. At q/k norms ~1 its scores are small, so it averages
# values over the whole context, and that common part, added at attn_output's std 0.02, swamps the token's own
# embedding in the residual: every router then sees one direction. Measured on the 30B shape
# (perf/route_spread.py, 512 random tokens in one pass): from the third layer on the prompt went to 16-45 of
# 128 experts (median 24), the top 16 taking 94-100% of the picks; with q/k norms at QK_GAIN alone 117-128,
# the top 16 up to 55% in deep layers; with attn_output at WEIGHT_STD / sqrt(2 n_layer) (GPT-2's residual
# output projections) alone 126-128, up to 35%; with both all 128 in every one of the 48 layers, the top 16
# taking 17-22% (16 / 128 = 12.5% plus sampling noise): uniform, as router.py's design assumes.
QK_GAIN = 3.0


def attn_out_std(n_layer: int) -> float:
    """attn_output's std (see QK_GAIN)."""
    return WEIGHT_STD / math.sqrt(2 * n_layer)


# Our own keys, so tools (the tier cache) can read back how a file was made; llama.cpp ignores them.
KEY_SKEW = "strata.synth.router_skew"
KEY_SEED = "strata.synth.seed"
KEY_MODE = "strata.synth.router_mode"  # "locality" (strata/synth/locality.py); absent: skew

# llama-quantize's tensor_type_fallback, for rows that a type's block does not divide.
_FALLBACK: dict[Q, Q] = {
    Q.IQ4_XS: Q.IQ4_NL,
    Q.Q2_K: Q.Q4_0,
    Q.Q3_K: Q.Q4_0,
    Q.Q4_K: Q.Q5_0,
    Q.Q5_K: Q.Q5_1,
    Q.Q6_K: Q.Q8_0,
}
# general.file_type for a file whose matrices are mostly this type (K-quants: the _M mixes).
FILE_TYPE: dict[Q, gguf.LlamaFileType] = {
    Q.F32: gguf.LlamaFileType.ALL_F32,
    Q.F16: gguf.LlamaFileType.MOSTLY_F16,
    Q.BF16: gguf.LlamaFileType.MOSTLY_BF16,
    Q.Q4_0: gguf.LlamaFileType.MOSTLY_Q4_0,
    Q.Q4_1: gguf.LlamaFileType.MOSTLY_Q4_1,
    Q.Q5_0: gguf.LlamaFileType.MOSTLY_Q5_0,
    Q.Q5_1: gguf.LlamaFileType.MOSTLY_Q5_1,
    Q.Q8_0: gguf.LlamaFileType.MOSTLY_Q8_0,
    Q.Q2_K: gguf.LlamaFileType.MOSTLY_Q2_K,
    Q.Q3_K: gguf.LlamaFileType.MOSTLY_Q3_K_M,
    Q.Q4_K: gguf.LlamaFileType.MOSTLY_Q4_K_M,
    Q.Q5_K: gguf.LlamaFileType.MOSTLY_Q5_K_M,
    Q.Q6_K: gguf.LlamaFileType.MOSTLY_Q6_K,
    Q.IQ4_NL: gguf.LlamaFileType.MOSTLY_IQ4_NL,
    Q.IQ4_XS: gguf.LlamaFileType.MOSTLY_IQ4_XS,
}


class Fill(enum.Enum):
    WEIGHT = "weight"  # blocks from the calibrated pool (any type)
    NORM = "norm"  # F32 ~ 1
    QK_NORM = "qk_norm"  # F32 ~ QK_GAIN
    ROUTER = "router"  # F32, skewed popularity (router.py)
    SMALL = "small"  # F32 ~ N(0, WEIGHT_STD)
    SSM_A = "ssm_a"  # -exp(A_log), A ~ U(1, 16) as HF initialises it
    SSM_DT = "ssm_dt"  # dt_bias ~ 1
    CONV = "conv"  # depthwise kernel, U(-1/sqrt(W), 1/sqrt(W)) (PyTorch's Conv1d init bound)


@dataclass(frozen=True, slots=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    qtype: Q
    fill: Fill
    std: float = WEIGHT_STD  # Fill.WEIGHT: the dequantized std

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        block, size = GGML_QUANT_SIZES[self.qtype]
        return self.numel // block * size


def fitting_type(qtype: Q, n_cols: int) -> Q:
    """`qtype`, or llama-quantize's fallback when its block does not divide a row of n_cols."""
    if n_cols % GGML_QUANT_SIZES[qtype][0] == 0:
        return qtype
    fallback = _FALLBACK.get(qtype, qtype)
    return fallback if n_cols % GGML_QUANT_SIZES[fallback][0] == 0 else Q.F16


def tensor_plan(s: Shape, quant: Q, output_quant: Q, head_blocks: bool = False) -> list[TensorSpec]:
    """Every tensor of the file, in writing order. head_blocks: attn_output in a type whose blocks divide a
    head's columns (the locality router edits them a head at a time)."""
    attn_out = fitting_type(quant, s.head_dim) if head_blocks else quant
    out_std = attn_out_std(s.n_layer)

    def mat(name: str, *shape: int, qtype: Q = quant, std: float = WEIGHT_STD) -> TensorSpec:
        return TensorSpec(name, shape, fitting_type(qtype, shape[-1]), Fill.WEIGHT, std)

    def f32(name: str, fill: Fill, *shape: int) -> TensorSpec:
        return TensorSpec(name, shape, Q.F32, fill)

    d = s.d_model
    out = [mat(tensor(T.TOKEN_EMBD), s.vocab, d)]
    for i in range(s.n_layer):
        out.append(f32(tensor(T.ATTN_NORM, i), Fill.NORM, d))
        if s.recurrent(i):
            out += _deltanet(s, i, mat, f32)
        else:
            q_rows = s.n_head * s.head_dim * (2 if s.arch == QWEN3NEXT else 1)  # qwen3next: [query | gate]
            out += [
                mat(tensor(T.ATTN_Q, i), q_rows, d),
                mat(tensor(T.ATTN_K, i), s.n_kv * s.head_dim, d),
                mat(tensor(T.ATTN_V, i), s.n_kv * s.head_dim, d),
                mat(tensor(T.ATTN_OUT, i), d, s.n_head * s.head_dim, qtype=attn_out, std=out_std),
                f32(tensor(T.ATTN_Q_NORM, i), Fill.QK_NORM, s.head_dim),
                f32(tensor(T.ATTN_K_NORM, i), Fill.QK_NORM, s.head_dim),
            ]
        post_norm = T.ATTN_POST_NORM if s.arch == QWEN3NEXT else T.FFN_NORM
        out += [
            f32(tensor(post_norm, i), Fill.NORM, d),
            f32(tensor(T.FFN_GATE_INP, i), Fill.ROUTER, s.n_expert, d),
            mat(tensor(T.FFN_GATE_EXP, i), s.n_expert, s.expert_ff, d),
            mat(tensor(T.FFN_UP_EXP, i), s.n_expert, s.expert_ff, d),
            mat(tensor(T.FFN_DOWN_EXP, i), s.n_expert, d, s.expert_ff),
        ]
        if s.shared_ff:
            out += [
                f32(tensor(T.FFN_GATE_INP_SHEXP, i), Fill.SMALL, 1, d),
                mat(tensor(T.FFN_GATE_SHEXP, i), s.shared_ff, d),
                mat(tensor(T.FFN_UP_SHEXP, i), s.shared_ff, d),
                mat(tensor(T.FFN_DOWN_SHEXP, i), d, s.shared_ff),
            ]
    out.append(f32(tensor(T.OUTPUT_NORM), Fill.NORM, d))
    if not s.tied:
        out.append(mat(tensor(T.OUTPUT), s.vocab, d, qtype=output_quant))
    return out


def _deltanet(s: Shape, i: int, mat, f32) -> list[TensorSpec]:  # type: ignore[no-untyped-def]
    """A Gated DeltaNet layer as the converter splits it (see strata/blocks/linear_attn.py)."""
    d, hv, inner = s.d_model, s.lin_v_heads, s.lin_v_heads * s.lin_head_dim
    return [
        mat(tensor(T.ATTN_QKV, i), s.conv_channels, d),
        mat(tensor(T.ATTN_GATE, i), inner, d),
        f32(tensor(T.SSM_CONV1D, i), Fill.CONV, s.conv_channels, s.conv_kernel),
        f32(tensor(T.SSM_DT, i, "bias"), Fill.SSM_DT, hv),
        f32(tensor(T.SSM_A, i, ""), Fill.SSM_A, hv),
        mat(tensor(T.SSM_BETA_ALPHA, i), 2 * hv, d),  # per key head [beta (r) | alpha (r)]
        f32(tensor(T.SSM_NORM, i), Fill.NORM, s.lin_head_dim),
        mat(tensor(T.SSM_OUT, i), d, inner),
    ]


def dense_values(spec: TensorSpec, rng: np.random.Generator) -> np.ndarray:
    """The F32 contents of a non-WEIGHT, non-ROUTER tensor."""
    n, shape = spec.numel, spec.shape
    if spec.fill is Fill.NORM:
        x = 1.0 + NORM_STD * rng.standard_normal(n)
    elif spec.fill is Fill.QK_NORM:
        x = QK_GAIN * (1.0 + NORM_STD * rng.standard_normal(n))
    elif spec.fill is Fill.SMALL:
        x = WEIGHT_STD * rng.standard_normal(n)
    elif spec.fill is Fill.SSM_A:
        x = -rng.uniform(1.0, 16.0, n)
    elif spec.fill is Fill.SSM_DT:
        x = 1.0 + 0.1 * rng.standard_normal(n)
    elif spec.fill is Fill.CONV:
        bound = shape[-1] ** -0.5
        x = rng.uniform(-bound, bound, n)
    else:
        raise ValueError(f"{spec.name}: {spec.fill} is not a dense fill")
    return x.astype(np.float32).reshape(shape)


def add_metadata(
    w: gguf.GGUFWriter, s: Shape, quant: Q, plan: list[TensorSpec], skew: float, seed: int
) -> None:
    """general.* and the hparams the converter writes for this architecture (not the tokenizer)."""
    expert = sum(t.numel for t in plan if "_exps." in t.name)
    total = sum(t.numel for t in plan)
    w.add_type(gguf.GGUFType.MODEL)
    w.add_name(f"strata-synth-{s.arch}-{s.name}-{quant.name.lower()}")
    w.add_size_label(gguf.size_label(total, total - expert, expert // s.n_expert, s.n_expert))
    w.add_block_count(s.n_layer)
    w.add_context_length(s.n_ctx)
    w.add_embedding_length(s.d_model)
    w.add_feed_forward_length(s.dense_ff)
    w.add_head_count(s.n_head)
    w.add_head_count_kv(s.n_kv)
    w.add_rope_freq_base(s.rope_base)
    w.add_layer_norm_rms_eps(s.eps)
    w.add_expert_count(s.n_expert)
    w.add_expert_used_count(s.top_k)
    w.add_key_length(s.head_dim)
    w.add_value_length(s.head_dim)
    w.add_file_type(FILE_TYPE[quant])
    w.add_expert_feed_forward_length(s.expert_ff)
    if s.arch == QWEN3NEXT:
        w.add_expert_shared_feed_forward_length(s.shared_ff)
        w.add_ssm_conv_kernel(s.conv_kernel)
        w.add_ssm_state_size(s.lin_head_dim)
        w.add_ssm_group_count(s.lin_k_heads)
        w.add_ssm_time_step_rank(s.lin_v_heads)
        w.add_ssm_inner_size(s.lin_v_heads * s.lin_head_dim)
        w.add_array(f"{s.arch}.{Keys.RECURRENT_LAYERS}", [s.recurrent(i) for i in range(s.n_layer)])
        w.add_full_attention_interval(s.full_attn_interval)
        w.add_rope_dimension_count(s.rope_dim)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    w.add_float32(KEY_SKEW, skew)
    w.add_uint32(KEY_SEED, seed)
