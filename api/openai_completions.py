"""POST /v1/completions (OpenAI legacy text completion): raw prompt in, raw text out."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator
from typing import Any

from sse_starlette.sse import EventSourceResponse
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from strata.api.body import read_json
from strata.api.errors import APIError, bad_request
from strata.api.generation import Finished, collect, deltas, submit
from strata.api.output_parser import ContentDelta
from strata.api.prompt import Prompt, check_context
from strata.api.prompt_tokens import min_tokens
from strata.api.sampling_args import openai_params
from strata.api.schemas import REFUSED_COMPLETION, CompletionRequest, parse, unsupported
from strata.api.sse import event_json
from strata.api.state import AppState
from strata.runtime.finish import OPENAI_FINISH


def _prompt(state: AppState, body: CompletionRequest) -> Prompt:
    """Raw prompts are the client's own markup: special texts in them are parsed (llama-server's
    behaviour), unless parse_special is false. Runs in a worker thread (see completions)."""
    if isinstance(body.prompt, str):
        tok = state.engine.tokenizer
        if (at_least := min_tokens(tok, body.prompt)) >= state.engine.n_ctx:
            check_context(state.engine, at_least, exact=False, param="prompt")
        ids = tok.encode(body.prompt, add_special=True, parse_special=body.parse_special)
    else:
        vocab = state.engine.tokenizer.vocab_size
        if any(not 0 <= t < vocab for t in body.prompt):
            raise bad_request(f"prompt token ids must be in 0..{vocab - 1}", param="prompt")
        ids = list(body.prompt)
    if not ids:
        raise bad_request("prompt is empty", param="prompt")
    check_context(state.engine, len(ids), param="prompt")
    return Prompt(ids, "", False)


async def completions(request: Request) -> Response:
    state: AppState = request.app.state.strata
    body = parse(CompletionRequest, await read_json(request))
    if body.n != 1:
        raise bad_request("only n=1 is supported", param="n")
    unsupported(body, REFUSED_COMPLETION)
    name = state.model_name(body.model)
    prompt = await asyncio.to_thread(_prompt, state, body)  # megabytes of prompt must not stall the loop
    stops = tuple([body.stop] if isinstance(body.stop, str) else (body.stop or []))
    req = await submit(
        state, prompt, openai_params(body), body.max_tokens or 16, stops, ignore_eos=body.ignore_eos
    )
    cid, created = f"cmpl-{secrets.token_hex(12)}", int(time.time())
    echo = body.prompt if (body.echo and isinstance(body.prompt, str)) else ""
    if body.stream:
        return EventSourceResponse(_stream(req, prompt, cid, created, name, echo))
    parts, fin = await collect(request, req, prompt, reasoning=False, raw=True)
    text = echo + "".join(d.text for d in parts if isinstance(d, ContentDelta))
    return JSONResponse(
        {
            "id": cid,
            "object": "text_completion",
            "created": created,
            "model": name,
            "choices": [
                {"index": 0, "text": text, "logprobs": None, "finish_reason": OPENAI_FINISH[fin.reason]}
            ],
            "usage": {
                "prompt_tokens": fin.prompt_tokens,
                "completion_tokens": fin.completion_tokens,
                "total_tokens": fin.prompt_tokens + fin.completion_tokens,
            },
            "timings": fin.timings,
        }
    )


async def _stream(
    req: Any, prompt: Prompt, cid: str, created: int, name: str, echo: str
) -> AsyncIterator[dict[str, str]]:
    def chunk(text: str, finish: str | None = None, **extra: Any) -> dict[str, str]:
        return {
            "data": event_json(
                {
                    "id": cid,
                    "object": "text_completion",
                    "created": created,
                    "model": name,
                    "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}],
                    **extra,
                }
            )
        }

    if echo:
        yield chunk(echo)
    try:
        async for d in deltas(req, prompt, reasoning=False, raw=True):
            if isinstance(d, Finished):
                yield chunk("", OPENAI_FINISH[d.reason], timings=d.timings)
            elif isinstance(d, ContentDelta):
                yield chunk(d.text)
    except APIError as e:
        yield {"data": event_json({"error": {"message": e.message, "type": "server_error", "code": e.code}})}
    yield {"data": "[DONE]"}
