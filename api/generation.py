"""The bridge between an HTTP handler and the scheduler: submit, then read parsed deltas.

Both protocols consume the same stream of ContentDelta / ReasoningDelta / ToolCallDelta and a
final Finished. Leaving the iterator early (a client disconnect cancels the handler's task)
cancels the request, which frees its slot at the next token.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import secrets
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request as HTTPRequest

from strata.api.errors import APIError, ClientGone
from strata.api.output_parser import ContentDelta, OutputParser, ReasoningDelta, ToolCallDelta, new_call_id
from strata.api.prompt import Prompt
from strata.api.schema_check import compiled
from strata.api.state import AppState
from strata.constraints.closing import closing_suffix
from strata.constraints.schema import Grammar
from strata.runtime.finish import FinishReason
from strata.sampling.params import SamplingParams
from strata.sched.request import DoneEvent, ErrorEvent, Request, TokenEvent
from strata.sched.slots import DeviceLostError, QueueFullError, ShuttingDownError

Delta = ContentDelta | ReasoningDelta | ToolCallDelta


# The final event of a stream: the scheduler's DoneEvent, its reason refined by what was parsed.
Finished = DoneEvent


class EngineFailure(APIError):
    """The window running this request failed; the request gets a 503 with the reason."""

    def __init__(self, reason: str) -> None:
        super().__init__(503, f"generation failed: {reason}", code="engine_error")


async def submit(
    state: AppState,
    prompt: Prompt,
    params: SamplingParams,
    max_tokens: int,
    stop: tuple[str, ...],
    ignore_eos: bool = False,
    think_budget: int | None = None,
    json_schema: dict[str, Any] | None = None,
    schema_param: str = "response_format",
) -> Request:
    """Queue the request. The schema the output must follow (the forced tool call's, else
    json_schema) is compiled here, off the loop, so a bad one is this request's 400 and never
    reaches the scheduler."""
    seed = params.seed if params.seed is not None else secrets.randbits(63)
    max_tokens = min(max_tokens, state.engine.n_ctx - len(prompt.ids))
    if state.config.n_predict > 0:  # --n-predict caps every request, as llama-server's -n does
        max_tokens = min(max_tokens, state.config.n_predict)
    tok = state.engine.tokenizer
    if prompt.json_seed is not None:
        grammar = await compiled(prompt.json_schema, "tools", tok, prompt.json_seed)
    else:
        grammar = await compiled(json_schema, schema_param, tok)
    req = Request(
        prompt.ids,
        params,
        max_tokens,
        seed,
        stop=stop,
        ignore_eos=ignore_eos,
        grammar=grammar,
        think_budget=think_budget,
        in_think=prompt.in_reasoning,
        turn_end=prompt.turn_end,
    )
    try:
        state.scheduler.submit(req)
    except QueueFullError as e:
        raise APIError(429, str(e), code="queue_full", headers={"Retry-After": str(e.retry_after)}) from None
    except ShuttingDownError as e:
        raise APIError(503, str(e), code="shutting_down", headers={"Connection": "close"}) from None
    except DeviceLostError as e:
        raise APIError(503, str(e), code="device_lost") from None
    return req


async def deltas(
    req: Request, prompt: Prompt, reasoning: bool, raw: bool = False
) -> AsyncIterator[Delta | Finished]:
    """Parsed output of a submitted request, ending with Finished (or raising EngineFailure).

    raw=True (text completions) passes text through untouched: no reasoning or tool parsing.
    """
    parser = OutputParser(reasoning=reasoning, start_in_reasoning=prompt.in_reasoning, prefix=prompt.prefix)
    forced, forced_text = prompt.json_seed is not None, []
    try:
        while True:
            ev = await req.events.get()
            if isinstance(ev, TokenEvent) and forced:
                forced_text.append(ev.text)
            elif isinstance(ev, TokenEvent) and raw:
                if ev.text:
                    yield ContentDelta(ev.text)
            elif isinstance(ev, TokenEvent):
                for d in parser.push(ev.text):
                    yield d
            elif isinstance(ev, ErrorEvent):
                raise EngineFailure(ev.reason)
            elif isinstance(ev, DoneEvent):
                if forced:
                    assert req.grammar is not None  # a forced call is always compiled
                    # closing a call cut short walks the grammar: off the loop
                    text = (prompt.json_seed or "") + "".join(forced_text)
                    yield await asyncio.to_thread(forced_call, text, req.grammar)
                for d in [] if (raw or forced) else parser.finish():
                    yield d
                reason = ev.reason
                if (forced or parser.tool_calls) and reason in (FinishReason.EOS, FinishReason.STOP_STRING):
                    reason = FinishReason.TOOL_CALLS
                yield dataclasses.replace(ev, reason=reason)
                return
    finally:
        req.cancel()  # no-op once finished; otherwise the client left and the slot is freed


def forced_call(text: str, grammar: Grammar) -> ToolCallDelta:
    """The tool call a schema-constrained forced turn wrote; one cut short by max_tokens is closed
    with a schema-valid ending, so clients always get parseable arguments."""
    obj = json.loads(text + closing_suffix(grammar.text, text))
    args = obj.get("arguments")
    return ToolCallDelta(
        0,
        new_call_id(),
        str(obj.get("name", "")),
        json.dumps(args if isinstance(args, dict) else {}, ensure_ascii=False),
    )


async def collect(
    http: HTTPRequest, req: Request, prompt: Prompt, reasoning: bool, raw: bool = False
) -> tuple[list[Delta], Finished]:
    """Non-streaming: gather every delta, cancelling the request if the client disconnects."""
    out: list[Delta] = []
    stream = deltas(req, prompt, reasoning, raw)
    watcher = asyncio.ensure_future(_wait_disconnect(http))
    try:
        async for d in stream:
            if watcher.done():  # the client left: a typed error, not a CancelledError traceback
                raise ClientGone()
            if isinstance(d, Finished):
                return out, d
            out.append(d)
    finally:
        watcher.cancel()
        await stream.aclose()
    raise EngineFailure("the request ended without a result")


async def _wait_disconnect(http: HTTPRequest) -> None:
    while not await http.is_disconnected():
        await asyncio.sleep(0.25)
