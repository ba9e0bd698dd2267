"""The prefix cache on hybrid models (Gated DeltaNet; qwen4exp's n-gram and indexer state too), whose
recurrent state cannot be cut back: the same prompt again, the next turn of a conversation, and a prompt
sharing only a long prefix reuse checkpoints, with the tokens of a run without the cache and `cached`
reported honestly."""

from __future__ import annotations

import asyncio
import itertools

import numpy as np
import pytest

from strata.engine import Engine
from strata.sampling.params import SamplingParams
from strata.sched import prefix_cache as pc
from strata.sched.request import DoneEvent, Request, TokenEvent
from strata.sched.scheduler import Scheduler


def _fixture(arch: str):
    from flagship_checks import build
    from oracle import flagship

    return build({"qwen3next": flagship.tiny_qwen3next, "qwen4exp": flagship.tiny_qwen4exp}[arch])["f32"]


async def _serve(sch: Scheduler, prompt: list[int], n: int = 5) -> tuple[list[int], DoneEvent]:
    req = Request(list(prompt), SamplingParams(temperature=0.0), n, seed=1)
    sch.submit(req)
    toks = []
    while True:
        ev = await asyncio.wait_for(req.events.get(), 120)
        if isinstance(ev, TokenEvent):
            if ev.token is not None:
                toks.append(ev.token)
        else:
            assert isinstance(ev, DoneEvent), ev
            return toks, ev


def test_checkpoints_never_cut_a_prefill_chunk_short():
    """Checkpoints every CHECKPOINT_EVERY tokens, or every chunk where chunks are longer (the GPU's 4096): a
    spacing below the chunk would end every chunk early. None within the pass's slack of the prompt's own."""
    from strata.runtime.passes import pass_slack

    assert pc.checkpoint_every(512) == pc.CHECKPOINT_EVERY == 2048 and pc.checkpoint_every(4096) == 4096
    eng = Engine.load(_fixture("qwen3next"), device="cpu", backend="numpy")
    state = eng.new_state()
    cache = pc.PrefixCache(1 << 30, pc.checkpoint_every(4096), pass_slack(4096))
    assert cache.next_stop(state, 10_000) == 4096
    state.n_past = 4096
    assert cache.wants(state, 10_000) and cache.next_stop(state, 10_000) == 8192
    state.n_past = 2048
    assert not cache.wants(state, 10_000) and cache.next_stop(state, 4200) == 4096
    assert cache.next_stop(state, 4100) == 4099  # 4096 is folded into the pass that ends at the prompt's own
    state.n_past = 4096
    assert cache.next_stop(state, 4200) == 4199  # the last but one: the prompt's own checkpoint


def test_a_prompt_a_few_tokens_past_the_chunk_is_read_in_one_pass():
    """A prompt up to pass_slack(chunk) tokens past the prefill chunk is read in one pass (the GPU's staging
    costs a pass whatever its length), a checkpoint within that slack of the prompt's own skipped; then its
    last token alone (the checkpoint before it). A longer prompt is read in chunks until its rest fits one
    folded pass. The tokens are those of a run in one long chunk."""
    from strata.runtime.passes import pass_slack

    big = Engine.load(_fixture("qwen3next"), device="cpu", backend="numpy", prefill_chunk=512)
    eng = Engine.load(_fixture("qwen3next"), device="cpu", backend="numpy", prefill_chunk=32)
    assert pass_slack(32) == 4
    rng = np.random.default_rng(8)
    passes: list[int] = []
    run = eng.model.forward_batch

    def counted(tokens, states):
        passes.append(sum(len(t) for t in tokens))
        return run(tokens, states)

    eng.model.forward_batch = counted  # type: ignore[method-assign]

    async def go(prompt: list[int]) -> list[int]:
        sch = Scheduler(eng, parallel=1, prefix_cache=pc.PrefixCache(1 << 30, every=32, fold=4))
        sch.start()
        toks, _ = await _serve(sch, prompt, 4)
        sch.stop()
        return toks

    for extra, want in ((3, [34, 1]), (10, [32, 9, 1])):
        prompt = [int(v) for v in rng.integers(100, 5000, 32 + extra)]
        passes.clear()
        toks = asyncio.run(go(prompt))
        assert passes[: len(want)] == want and set(passes[len(want) :]) == {1}
        ref = big.generate(prompt, max_tokens=4, params=SamplingParams(temperature=0.0), ignore_eos=True)
        assert toks == list(ref.run().tokens)


@pytest.mark.parametrize("arch", ["qwen3next", "qwen4exp"])
def test_hybrid_prompts_reuse_checkpoints(arch):
    eng = Engine.load(_fixture(arch), device="cpu", backend="numpy")
    rng = np.random.default_rng(5)
    prompt = [int(v) for v in rng.integers(100, 5000, 40)]
    other = prompt[:20] + [int(v) for v in rng.integers(100, 5000, 10)]  # parts from `prompt` at 20

    async def go(cache: pc.PrefixCache | None) -> list[tuple[list[int], int]]:
        sch = Scheduler(eng, parallel=1, prefix_cache=cache)
        sch.start()
        out = []
        first, d = await _serve(sch, prompt)
        out.append((first, d.cached_tokens))
        for p in (prompt, prompt + first + [7, 8, 9], other):
            toks, d = await _serve(sch, p)
            out.append((toks, d.cached_tokens))
        sch.stop()
        return out

    plain = asyncio.run(go(None))
    cached = asyncio.run(go(pc.PrefixCache(1 << 30, every=16)))
    assert [t for t, _ in cached] == [t for t, _ in plain], "the cache changed the tokens"
    first = plain[0][0]
    # the next turn reuses the whole answer: the decode pipeline (sched/ahead.py) fed its last token too
    assert [c for _, c in cached] == [0, len(prompt) - 1, len(prompt) + len(first), 16]
    assert all(c == 0 for _, c in plain)


def test_a_tool_loop_computes_only_what_is_new():
    """Four turns of a chat whose history grows (assistant answer + tool output): each turn reuses at least
    the previous prompt (one token short), so only the new turn's tokens are computed."""
    eng = Engine.load(_fixture("qwen3next"), device="cpu", backend="numpy", n_ctx=4096)
    tool = " ".join(f"line {i}: value={i * 37 % 101}" for i in range(20))

    async def go() -> list[tuple[int, int]]:
        sch = Scheduler(eng, parallel=1, prefix_cache=pc.PrefixCache(1 << 30))
        sch.start()
        msgs = [{"role": "user", "content": "Fix the bug."}]
        out = []
        for turn in range(4):
            ids = eng.chat_ids(msgs)
            toks, done = await _serve(sch, ids, 6)
            out.append((len(ids), done.cached_tokens))
            msgs += [
                {"role": "assistant", "content": eng.tokenizer.decode(toks)},
                {"role": "user", "content": f"Tool result {turn}:\n{tool}"},
            ]
        sch.stop()
        return out

    turns = asyncio.run(go())
    print(turns)
    assert turns[0][1] == 0
    for (prev, _), (_, cached) in itertools.pairwise(turns):
        assert cached >= prev - 1


@pytest.mark.parametrize("forced", [True, False], ids=["forced-call", "no-thinking"])
def test_the_next_turn_reuses_the_conversation_before_the_generation_prompt(forced):
    """The server's prompts end in a generation prompt the next turn does not repeat: a forced tool call's
    prompt in an empty think block and the call's opening, a reply without thoughts' in the empty think block
    (the Qwen3 template writes a past call or answer its own way). A checkpoint one token before the prompt's
    end matched nothing there (a ten-round tool loop computed every token it was sent); the prompt's own
    checkpoint is at its `turn_end`, the end of its conversation, and each turn reuses the last one's; one
    before its last token serves the same prompt again where the generation prompt is short."""
    from strata.api.prompt import Chat, ToolMode, build_prompt
    from strata.runtime.passes import STEP_ROWS

    eng = Engine.load(_fixture("qwen3next"), device="cpu", backend="numpy", n_ctx=4096)
    tool = {
        "type": "function",
        "function": {
            "name": "read_file",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    }
    body = " ".join(f"def f{i}(x): return x * {i * 37 % 101}" for i in range(12))

    def prompt(msgs):
        if forced:
            return build_prompt(eng, Chat(msgs, [tool], ToolMode.REQUIRED))
        return build_prompt(eng, Chat(msgs, thinking=False))

    async def go(cache: pc.PrefixCache | None) -> list[tuple[list[int], int | None, int, list[int]]]:
        sch = Scheduler(eng, parallel=1, prefix_cache=cache)
        sch.start()
        msgs: list[dict] = [
            {"role": "system", "content": "You edit code."},
            {"role": "user", "content": "Fix it."},
        ]
        out = []
        for turn in range(5):
            p = prompt(msgs[:-2] if turn == 4 else msgs)  # the last: the fourth turn's prompt again
            req = Request(list(p.ids), SamplingParams(temperature=0.0), 3, seed=1, turn_end=p.turn_end)
            sch.submit(req)
            toks = []
            while not isinstance(ev := await asyncio.wait_for(req.events.get(), 120), DoneEvent):
                toks += [ev.token] if isinstance(ev, TokenEvent) and ev.token is not None else []
            out.append((p.ids, p.turn_end, ev.cached_tokens, toks))
            if forced:
                args = {"path": f"src/m{turn}.py"}
                call = {
                    "id": f"c{turn}",
                    "type": "function",
                    "function": {"name": "read_file", "arguments": args},
                }
                msgs += [
                    {"role": "assistant", "content": None, "tool_calls": [call]},
                    {"role": "tool", "tool_call_id": f"c{turn}", "content": body},
                ]
            else:
                msgs += [{"role": "assistant", "content": f"Done {turn}."}, {"role": "user", "content": body}]
        sch.stop()
        return out

    turns = asyncio.run(go(pc.PrefixCache(1 << 30)))
    assert [t[3] for t in turns] == [t[3] for t in asyncio.run(go(None))], "the cache changed the tokens"
    assert turns[0][2] == 0
    # the same prompt again: all but its last token where its generation prompt is read as decode steps (a
    # forced call's opening is longer: from the end of its conversation)
    (ids, end, _, _), again = turns[-2], turns.pop()
    assert again[0] == ids and again[2] == (len(ids) - 1 if len(ids) - 1 - end <= STEP_ROWS else end)
    assert (again[2] == end) == forced
    for (ids, end, _, _), (nxt, _, cached, _) in itertools.pairwise(turns):
        assert end is not None and end < len(ids) - 1  # the generation prompt is more than a token
        assert nxt[:end] == ids[:end] and nxt[: len(ids) - 1] != ids[:-1]  # the next turn parts from it there
        assert cached == end  # so it computes only what is new


def test_an_anthropic_tool_loop_reads_only_what_is_new():
    """An IDE assistant's loop over the Anthropic Messages API, through the real server: forced tool_use
    turns answered by tool_result blocks. From the second turn the prefix cache answers for the whole earlier
    conversation: `cache_read_input_tokens` is at least the last turn's prompt less its generation prompt, and
    `input_tokens` (what was computed) is what the turn added."""
    from server_fixture import running_server

    tool = {
        "name": "read_file",
        "description": "A file of the repository.",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
    }
    body = " ".join(f"def f{i}(x): return x * {i * 37 % 101}" for i in range(16))
    with (
        running_server(_fixture("qwen3next"), "--parallel", "1", "--ctx-size", "1024") as server,
        server.client() as c,
    ):
        msgs: list[dict] = [{"role": "user", "content": "Find the parser: read the files."}]
        usage = []
        for turn in range(3):
            r = c.post(
                "/v1/messages",
                json={
                    "model": "m",
                    "max_tokens": 24,
                    "system": "You edit code.",
                    "messages": msgs,
                    "tools": [tool],
                    "tool_choice": {"type": "any"},
                    "temperature": 0,
                },
            )
            assert r.status_code == 200, r.text
            out = r.json()
            usage.append(out["usage"])
            calls = [b for b in out["content"] if b["type"] == "tool_use"]
            if not calls:  # the model's call did not close within max_tokens: the turn is still resent
                calls = [
                    {"type": "tool_use", "id": f"t{turn}", "name": "read_file", "input": {"path": "a.py"}}
                ]
            msgs += [
                {"role": "assistant", "content": calls},
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": calls[0]["id"], "content": body}],
                },
            ]
    sent = [u["input_tokens"] + u["cache_read_input_tokens"] for u in usage]
    print(usage)
    assert usage[0]["cache_read_input_tokens"] == 0
    for prev, u, total in zip(sent, usage[1:], sent[1:]):
        assert u["cache_read_input_tokens"] >= prev - 16, usage  # all but the last turn's generation prompt
        assert u["input_tokens"] < total - prev + 16, usage
