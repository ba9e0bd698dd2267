"""MXFP4 (OCP microscaling FP4, as in gpt-oss): 32 e2m1 codes sharing one e8m0 power-of-two scale.

Block layout: e (uint8 exponent) | qs[16] (element j = low nibble of qs[j], j + 16 = high nibble).
ggml stores the e2m1 values doubled (kvalues 0, 1, 2, 3, 4, 6, 8, 12 and negatives) and halves the
scale instead, so every product is (power of two) x (small int): exact, like the reference's.
"""

from __future__ import annotations

import numpy as np

from strata.quants import iq_tables as tables
from strata.quants._common import compact, scaled
from strata.quants.iquants import kv_nibbles


def deq_mxfp4(blocks: np.ndarray, out: np.ndarray) -> None:
    d = np.take(tables.e8m0_half(), blocks[:, :1], mode="clip")  # [n, 1] float32
    q = kv_nibbles(compact(blocks, 1, 17), 1, tables.KVALUES_MXFP4)  # [n, 1, 32] int8
    scaled(q, d, out, 32)
