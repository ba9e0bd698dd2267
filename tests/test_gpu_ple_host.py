"""qwen4exp's PLE rows on their way to the GPU, in CI over tests/fake_cupy.py: `prepare` uploads the gathered
rows as the table stores them and `embed` has get_rows decode them on the device (get_rows is held to the
numpy dequantizer by tests/test_gpu_kernels.py). Decoding what was uploaded, row by row as get_rows reads
it, must give the embeddings the host decodes, for several tokens and a history that carries over."""

from __future__ import annotations

from types import SimpleNamespace

import fake_cupy
import numpy as np
from gpu_fixtures import fixture

from strata.blocks.ple import embeddings, ple_rows
from strata.gguf import GGUFFile
from strata.models import model_class
from strata.quants import dequantize
from strata.runtime.weights import WeightStore


def test_uploaded_rows_decode_to_the_hosts_embeddings(monkeypatch) -> None:
    import strata.gpu.qwen4exp as q4

    cp = fake_cupy.install(monkeypatch)
    monkeypatch.setattr(q4, "cupy_module", lambda: cp)
    g = GGUFFile(fixture("qwen4exp"))
    cpu = model_class(g)(g, WeightStore(g, 1 << 30))
    pd = q4.hc_dims(cpu, 256).ple
    assert pd is not None and pd.qtype is not None, "the fixture's table is a type the GPU decodes"
    n = 5
    hd = q4.hc_dims(cpu, 256)
    act = SimpleNamespace(hc=q4.HCBuffers(hd, n))
    parts = SimpleNamespace(cpu=cpu, host_parts={"hash": 0.0, "gather": 0.0, "upload": 0.0})
    pp, table = cpu.ple, cpu.ple_table
    history = np.full(pp.ngram - 1, pp.eos, np.int64)
    state = SimpleNamespace(layers={q4.HISTORY: q4.PLEHistory(history.copy())})
    rng = np.random.default_rng(3)
    for tokens in (rng.integers(0, 900, n), rng.integers(0, 900, 2)):
        q4.Qwen4ExpParts.prepare(parts, [tokens], [state], act)  # type: ignore[arg-type]
        rows = ple_rows(tokens, pp, history)
        history = np.concatenate([history, tokens])[-(pp.ngram - 1) :]
        want = embeddings(table, table.gather(rows.reshape(-1), len(tokens)), len(tokens))
        m = act.hc.e_rows
        k = len(tokens) * pd.heads
        raw = np.asarray(m.data[: k * m.row_bytes]).reshape(k, m.row_bytes)
        got = dequantize(raw, m.qtype, m.cols).reshape(len(tokens), pd.width)  # get_rows' rows, in order
        np.testing.assert_array_equal(got, want)
        assert np.array_equal(state.layers[q4.HISTORY].ids, history)
