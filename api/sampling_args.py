"""Protocol sampling fields -> SamplingParams, with llama-server's defaults where a field is absent."""

from __future__ import annotations

import dataclasses

from strata.api.errors import bad_request
from strata.api.schemas import SamplingFields
from strata.api.schemas_anthropic import MessagesRequest
from strata.sampling.params import SamplingError, SamplingParams

# llama-server's defaults: the clients we serve were tuned against them.
DEFAULTS = SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05)


def _checked(p: SamplingParams) -> SamplingParams:
    try:
        p.validate()
    except SamplingError as e:
        raise bad_request(str(e), param=str(e).split("=", 1)[0]) from None
    return p


def _given(body: object, names: tuple[str, ...]) -> dict[str, object]:
    return {n: v for n in names if (v := getattr(body, n, None)) is not None}


def openai_params(b: SamplingFields) -> SamplingParams:
    names = (
        "temperature",
        "top_k",
        "top_p",
        "min_p",
        "repeat_penalty",
        "presence_penalty",
        "frequency_penalty",
        "seed",
    )
    return _checked(dataclasses.replace(DEFAULTS, **_given(b, names)))


def anthropic_params(b: MessagesRequest) -> SamplingParams:
    given = _given(b, ("temperature", "top_k", "top_p"))
    seed = (b.metadata or {}).get("seed")
    if isinstance(seed, int) and not isinstance(seed, bool) and 0 <= seed < 2**63:
        given["seed"] = seed
    return _checked(dataclasses.replace(DEFAULTS, **given))
