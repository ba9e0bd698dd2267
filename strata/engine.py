"""Engine: a loaded model with its tokenizer and chat template, and the public API the tests,
the CLI and the server use: `Engine.load`, `engine.logits`, `engine.generate`."""

from __future__ import annotations

import dataclasses
import logging
import os
import secrets
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from strata.conf import EngineOptions
from strata.conf.engine import parse_overrides
from strata.errors import ConfigError, ContextOverflowError
from strata.gguf import GGUFFile
from strata.models import Model, model_class
from strata.runtime.kvcache import KVCache, KVType
from strata.runtime.passes import PASS_SLACK, pass_rows, pass_spans
from strata.runtime.sequence import ActiveSequence, Chunk, Constraint, GenerationResult, Timings
from strata.runtime.state import SequenceState
from strata.runtime.weights import WeightStore, check_supported
from strata.sampling.params import SamplingParams
from strata.text.chat_template import ChatTemplate
from strata.text.tokenizer import Tokenizer
from strata.tiers import context
from strata.tiers.budget import Ledger
from strata.tiers.grow import SlotLender, floor_positions
from strata.tiers.layout import ExpertLayout
from strata.tiers.lookahead import PrefetchCounts
from strata.tiers.profile import Digests, Profile, cache_root
from strata.tiers.profile import Keeper as ProfileKeeper
from strata.tiers.profile import load as load_profile
from strata.tiers.share import parse_pcie_frac
from strata.tiers.slots import ExpertCache, cpu_tiers
from strata.tiers.telemetry import TierUse

__all__ = ["Chunk", "Engine", "Generation", "GenerationResult", "Timings"]


class Generation:
    """Iterate for Chunks; `result` is complete once iteration ends."""

    def __init__(self, steps: Iterator[Chunk], result: GenerationResult) -> None:
        self._steps = steps
        self.result = result

    def __iter__(self) -> Iterator[Chunk]:
        return self._steps

    def run(self) -> GenerationResult:
        for _ in self._steps:
            pass
        return self.result


def _device(opts: EngineOptions, arch: str) -> str:
    """Where the model runs. `backend` only picks the CPU path (numpy or jit), so `python -m strata`
    with its jit default still takes the GPU when auto finds one."""
    from strata.gpu import resolve_device

    return resolve_device(opts.device, arch)


def _profile_keeper(gguf: GGUFFile, opts: EngineOptions) -> ProfileKeeper | None:
    """The routing profile of a MoE file: the saved one (if its digest is known and one was saved) to fill the
    cache from, and the counts this run adds, saved at exit."""
    layout = ExpertLayout.from_gguf(gguf)
    if layout is None:
        return None
    root = cache_root(opts.jit_cache)
    shape = (len(layout.layers), layout.n_expert)
    digest = Digests(root).known(gguf.path)
    saved = load_profile(root, digest, shape) if digest else None
    counts = Profile(saved.uses.copy() if saved else np.zeros(shape), saved.tokens if saved else 0)
    return ProfileKeeper(root, gguf, counts, digest, saved)


def _count_routing(cache: ExpertCache | None, keeper: ProfileKeeper | None) -> ProfileKeeper | None:
    """Let the expert cache count into the profile and save it at exit (no cache: every expert is resident,
    and nothing needs a profile)."""
    if cache is None or keeper is None:
        return None
    import atexit

    cache.profile = keeper.profile
    keeper.start()
    atexit.register(keeper.save)
    return keeper


def _kv_bytes_per_token(model: Model, kind: KVType | None = None) -> int:
    """One position's KV over the model's attention layers, in `kind` cells (default: the model's)."""
    a = model.params.attn
    n_attn = len(model.new_state().kv.length)
    return KVCache.bytes_per_token(kind or model.kv_type, n_attn, a.n_kv, a.head_dim)


def _stand_in_ledger(cache: ExpertCache, model: Model, opts: EngineOptions) -> Ledger:
    """--kv-grow on the CPU: the stand-in VRAM is the GPU plan's share of it, the slots at start and the KV
    room of each sequence's first chunk (tiers/grow.py); a KV growing past that takes slots."""
    per = _kv_bytes_per_token(model)
    floor = opts.n_seq * floor_positions(opts.n_ctx, opts.prefill_chunk) * per
    held = cache.n_slots * cache.layout.slot_bytes
    ledger = Ledger(held + floor, held)
    SlotLender(cache, ledger)
    return ledger


def _cpu_context(model: Model, n_seq: int, asked: int) -> int:
    """The CPU path's context: the one asked for, refused when its KV cannot fit in the RAM available (the
    KV grows into RAM as the context fills), else chosen (strata.tiers.context.on_cpu) and logged."""
    import psutil

    available = psutil.virtual_memory().available
    per = _kv_bytes_per_token(model)
    if asked:
        if n_seq * per * asked > available:
            int8 = n_seq * asked * _kv_bytes_per_token(model, KVType.INT8)
            raise ConfigError(
                "n_ctx",
                asked,
                f"{n_seq} sequence(s) of {asked:,} positions need "
                f"{n_seq * per * asked / 2**30:,.1f} GiB of {model.kv_type} KV when full, more than "
                f"the {available / 2**30:,.1f} GiB of RAM available (int8 KV: "
                f"{int8 / 2**30:,.1f} GiB; a shorter context, or fewer sequences)",
            )
        return asked
    choice = context.on_cpu(model.params.n_ctx_train, per, n_seq, available)
    logging.getLogger("strata.engine").info("%s", choice.line)
    return choice.n_ctx


class Engine:
    def __init__(self, gguf: GGUFFile, model: Model, tokenizer: Tokenizer, options: EngineOptions) -> None:
        self.gguf = gguf
        self.model = model
        self.tokenizer = tokenizer
        self.options = options
        self.profile_keeper: ProfileKeeper | None = None  # counts routing into the saved profile (tiers only)
        self.template = ChatTemplate.from_gguf(gguf, tokenizer)
        # the GPU model chose its context with its memory plan; the CPU's was chosen in load()
        self.n_ctx = getattr(model, "n_ctx", 0) or options.n_ctx or model.params.n_ctx_train

    @classmethod
    def load(cls, path: str | os.PathLike[str] | None = None, **options: Any) -> Engine:
        """Open a GGUF (None: the default model, fetched and verified on first use, as `python -m strata`
        serves it) and build its model; raises typed errors for bad files and options."""
        opts = EngineOptions.from_kwargs(**options)
        if path is None:
            from strata.hub import default_model

            path = default_model.pull()
        gguf = GGUFFile(path, parse_overrides(opts.override_kv, "override_kv"))
        if opts.verify:
            gguf.verify(opts.verify)
        model_cls = model_class(gguf)
        check_supported(gguf)
        weights = WeightStore(gguf, opts.weight_cache_mib << 20)
        weights.table_io = opts.ple_io
        device = _device(opts, gguf.architecture)
        keeper = _profile_keeper(gguf, opts) if opts.routing_profile == "auto" else None
        if not opts.prefill_chunk and device != "cuda":  # the GPU chooses its own (gpu/plan.py AUTO_CHUNKS)
            opts = dataclasses.replace(opts, prefill_chunk=512)
        if device == "cuda":
            from strata.gpu import gpu_model
            from strata.gpu.model import GpuOptions
            from strata.gpu.tiers import TierOptions

            share = TierOptions(
                parse_pcie_frac(opts.pcie_frac),
                opts.probe,
                opts.pool_workers,
                opts.aux_cpus,
                opts.jit_cache,
                cache_policy=opts.cache_policy,
                swap_budget=opts.swap_budget_mib << 20,
                profile=keeper.saved if keeper else None,
                prefetch=opts.prefetch,
                ram_budget_mib=opts.ram_budget_mib,
                kv_grow=opts.kv_grow,
            )
            gpu_opts = GpuOptions(
                opts.vram_budget_mib,
                opts.n_ctx,
                opts.prefill_chunk,
                reserve_mib=opts.vram_reserve_mib,
                expert_cache=opts.expert_cache,
                seqs=opts.n_seq,
                tiers=share,
                kv_type=KVType.INT8 if opts.kv_type == KVType.INT8 else KVType.F16,
                kv_grow=opts.kv_grow,
                kv_resident=opts.kv_resident,
            )
            if opts.kv_type == KVType.F32:
                raise ConfigError(
                    "kv_type",
                    opts.kv_type,
                    "the GPU's attention kernels read f16 or int8 cells; f32 KV runs on the CPU (device=cpu)",
                )
            model = gpu_model(model_cls(gguf, weights), gpu_opts)
            opts = dataclasses.replace(opts, prefill_chunk=model.chunk)
            engine = cls(gguf, model, Tokenizer.from_gguf(gguf), opts)
            engine.profile_keeper = _count_routing(engine.expert_cache, keeper)
            tiers = getattr(engine.model, "tiers", None)
            if opts.record_routes and tiers is not None:
                tiers.record_routes(Path(opts.record_routes))
            return engine
        counted = None
        if opts.expert_cache != "auto":
            profile = keeper.saved if keeper else None
            weights.tiers = cpu_tiers(
                gguf, opts.expert_cache, profile, opts.ram_budget_mib, opts.prefetch, opts.kv_grow
            )
            counted = _count_routing(weights.tiers, keeper)
            weights.tiers.use_policy(opts.cache_policy, opts.swap_budget_mib << 20)
            if opts.record_routes:
                weights.tiers.record(Path(opts.record_routes))
        elif opts.kv_grow:
            raise ConfigError(
                "kv_grow",
                True,
                "on the CPU the KV grows into the stand-in expert cache's slots: give expert_cache a size "
                "(--expert-cache 50%, say)",
            )
        if opts.backend == "jit":
            from strata.jit.backend import start

            cache = Path(opts.jit_cache) if opts.jit_cache else None
            weights.jit = start(gguf, cache, opts.pool_workers, opts.aux_cpus)
        model = model_cls(gguf, weights)
        model.kv_type = KVType.F32 if opts.kv_type == "auto" else KVType(opts.kv_type)
        model.kv_resident, model.kv_chunk = opts.kv_resident, opts.prefill_chunk + PASS_SLACK
        opts = dataclasses.replace(opts, n_ctx=_cpu_context(model, opts.n_seq, opts.n_ctx))
        if opts.kv_grow and weights.tiers is not None:
            model.kv_ledger = _stand_in_ledger(weights.tiers, model, opts)
        engine = cls(gguf, model, Tokenizer.from_gguf(gguf), opts)
        engine.profile_keeper = counted
        return engine

    @property
    def expert_cache(self) -> ExpertCache | None:
        """The expert tiers the model reads its experts through (None: every expert resident)."""
        return getattr(self.model, "expert_cache", None)

    @property
    def arch(self) -> str:
        return self.gguf.architecture

    def pin_helper_thread(self) -> None:
        """Keep the calling thread (the HTTP loop) on the --aux-cpus, off the CPU pool's workers."""
        backend = getattr(getattr(self.model, "w", None), "jit", None)
        if backend is not None:
            backend.pool.pin_helper()

    def new_state(self) -> SequenceState:
        return self.model.new_state()

    def warm_up(self, n_seq: int = 1) -> None:
        """Pay now what the first requests would: kernel builds (JIT, NVRTC), a decode graph for every
        batch size up to n_seq, a prefill pass, a snapshot's pinned blocks. States are thrown away; the model
        is unchanged."""
        tok = self.tokenizer.bos_id if self.tokenizer.bos_id is not None else 0
        prompt = np.full(min(16, max(1, self.n_ctx - 2)), tok, np.int64)
        for b in range(1, n_seq + 1):
            states = [self.new_state() for _ in range(b)]
            for st in states:
                self.model.forward(prompt, st, all_logits=False)
            self.model.forward_batch([np.array([tok])] * b, states)
            if b == 1:  # the prefix cache's first snapshot: on the GPU, its pinned blocks (gpu/pinned.py)
                states[0].snapshot()
            del states
        self._forget_counts()

    def prefill_costs(self, sizes: Sequence[int], reps: int = 2) -> list[tuple[int, float]]:
        """(tokens, seconds) of a prompt pass of each size on a fresh state, the fastest of `reps` (the first
        may build kernels): what a prefill window costs, for the server's pacer before its first prompt.
        Random tokens (seeded), so the routing is a prompt's, not one token's; the counters are reset."""
        ids = np.random.default_rng(0).integers(0, self.model.params.vocab, max(sizes))
        out = []
        for n in sizes:
            best = float("inf")
            for _ in range(reps):
                st = self.new_state()
                t = time.perf_counter()
                self.model.forward(ids[:n], st, all_logits=False)
                best = min(best, time.perf_counter() - t)
                del st
            out.append((n, best))
        self._forget_counts()
        return out

    def _forget_counts(self) -> None:
        """The tiers' counters back to zero: warm-up and timing passes are no part of the workload they
        describe."""
        if self.expert_cache is not None:
            self.expert_cache.use = TierUse()
            self.expert_cache.prefetch = PrefetchCounts()

    def logits(self, token_ids: Sequence[int]) -> np.ndarray:
        """float32 logits [T, vocab] for every position of `token_ids`, from a fresh state."""
        ids = np.asarray(token_ids, dtype=np.int64)
        return self.model.forward(ids, self.new_state(), all_logits=True)

    @property
    def prompt_rows(self) -> int:
        """Rows a lone prompt's pass reads: the model's wide passes (the GPU's, tiered), else the chunk."""
        return max(self.model.prompt_rows, self.options.prefill_chunk)

    def prefill(self, state: SequenceState, ids: Sequence[int]) -> np.ndarray:
        """Feed `ids` in passes of prompt_rows; returns the logits [vocab] after the last one."""
        chunk = self.prompt_rows
        last = None
        for s, e in pass_spans(len(ids), chunk):
            last = self.model.forward(np.asarray(ids[s:e]), state, all_logits=False)
        assert last is not None, "prefill needs at least one token"
        return last[-1]

    def chat_ids(self, messages: list[dict[str, Any]], **template_kw: Any) -> list[int]:
        """The prompt ids of a conversation: the chat template's text through Tokenizer.encode_chat (whose
        BOS rule the server's prompts follow too)."""
        text = self.template.render(messages, add_generation_prompt=True, **template_kw)
        return self.tokenizer.encode_chat(text)

    def generate(
        self,
        prompt: str | Sequence[int] | None = None,
        *,
        messages: list[dict[str, Any]] | None = None,
        max_tokens: int = 128,
        params: SamplingParams | None = None,
        stop: Sequence[str] = (),
        ignore_eos: bool = False,
        template_kw: dict[str, Any] | None = None,
        constraints: Sequence[Constraint] = (),
    ) -> Generation:
        """Stream tokens for a text prompt, token ids, or chat messages."""
        params = params or SamplingParams()
        params.validate()
        if messages is not None:
            ids = self.chat_ids(messages, **(template_kw or {}))
        elif isinstance(prompt, str):
            ids = self.tokenizer.encode(prompt, add_special=True, parse_special=True)
        else:
            ids = [int(t) for t in (prompt or [])]
        if not ids:
            ids = [self.tokenizer.bos_id]
        if len(ids) >= self.n_ctx:
            raise ContextOverflowError(len(ids), self.n_ctx)
        max_tokens = min(max_tokens, self.n_ctx - len(ids))
        seed = params.seed if params.seed is not None else secrets.randbits(63)
        seq = ActiveSequence(
            self.tokenizer,
            self.new_state(),
            ids,
            params=params,
            seed=seed,
            max_tokens=max_tokens,
            stop=stop,
            ignore_eos=ignore_eos,
            constraints=constraints,
            tiered=self.expert_cache is not None,
        )
        return Generation(self._steps(seq), seq.result)

    def _steps(self, seq: ActiveSequence) -> Iterator[Chunk]:
        chunk = self.prompt_rows
        tables = getattr(self.model, "ple_stats", None)  # lookup-table traffic, for the timings
        start = (tables.rows, tables.bytes, tables.disk_bytes, tables.wait_s) if tables is not None else None
        while not seq.finished:
            ids = seq.next_input(pass_rows(len(seq.prompt) - seq.state.n_past, chunk))
            logits = self.model.forward(ids, seq.state, all_logits=False)[-1]
            if tables is not None and start is not None:
                t = seq.result.timings
                t.table_rows, t.table_bytes = tables.rows - start[0], tables.bytes - start[1]
                t.table_disk_bytes, t.table_wait_ms = (
                    tables.disk_bytes - start[2],
                    (tables.wait_s - start[3]) * 1e3,
                )
            yield from seq.accept(logits)
