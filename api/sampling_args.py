"""Protocol sampling fields -> SamplingParams, with llama-server's defaults where a field is absent."""

from __future__ import annotations

from strata.api.errors import bad_request
from strata.api.schemas import MessagesRequest, SamplingFields
from strata.sampling import SamplingError, SamplingParams

# llama-server's defaults: the clients we serve were tuned against them.
DEFAULTS = SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05)


def _checked(p: SamplingParams) -> SamplingParams:
    try:
        p.validate()
    except SamplingError as e:
        raise bad_request(str(e), param=str(e).split("=", 1)[0]) from None
    return p


def openai_params(b: SamplingFields) -> SamplingParams:
    d = DEFAULTS
    return _checked(SamplingParams(
        temperature=d.temperature if b.temperature is None else b.temperature,
        top_k=d.top_k if b.top_k is None else b.top_k,
        top_p=d.top_p if b.top_p is None else b.top_p,
        min_p=d.min_p if b.min_p is None else b.min_p,
        repeat_penalty=1.0 if b.repeat_penalty is None else b.repeat_penalty,
        presence_penalty=b.presence_penalty or 0.0,
        frequency_penalty=b.frequency_penalty or 0.0,
        seed=b.seed,
    ))


def anthropic_params(b: MessagesRequest) -> SamplingParams:
    d = DEFAULTS
    return _checked(SamplingParams(
        temperature=d.temperature if b.temperature is None else b.temperature,
        top_k=d.top_k if b.top_k is None else b.top_k,
        top_p=d.top_p if b.top_p is None else b.top_p,
        min_p=d.min_p,
        seed=(b.metadata or {}).get("seed") if isinstance((b.metadata or {}).get("seed"), int) else None,
    ))
