"""Request bodies of the OpenAI API (and the shared `parse`), validated with pydantic.

Unknown fields are accepted and ignored (clients send many); wrong types, out-of-range or
non-finite numbers and missing required fields become 400s naming the field (see `parse`). Fields
we know but cannot honour (logprobs, logit_bias, best_of, suffix, ...) are declared so that a
request using them is refused by name instead of silently answered without them.
"""

from __future__ import annotations

from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from strata.api.errors import bad_request

M = TypeVar("M", bound=BaseModel)
MAX_TOKENS = 1 << 31  # any larger max_tokens is a client bug; the context bounds it anyway


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)  # JSON's 1e400 parses as inf


def parse(cls: type[M], data: dict[str, Any]) -> M:
    """Validate a decoded body (api/body.py), raising a 400 APIError that names the bad field."""
    try:
        return cls.model_validate(data)
    except ValidationError as e:
        # a union reports one error per member; the deepest is the one about the client's value
        err = max(e.errors(), key=lambda x: len(_field_path(x["loc"])))
        loc = ".".join(_field_path(err["loc"]))
        raise bad_request(f"{loc}: {err['msg']}", param=loc) from None


def _field_path(loc: tuple[int | str, ...]) -> list[str]:
    """Field names and indexes of an error location, without pydantic's union member tags
    ('str', 'list[TextPart]', 'NamedToolChoice'): our field names are all lower snake case."""
    return [str(p) for p in loc if isinstance(p, int) or not (p[:1].isupper() or "[" in p or p in _TAGS)]


_TAGS = frozenset({"str", "int", "float", "bool", "list", "dict", "none", "literal", "function-after"})


def unsupported(body: BaseModel, refused: dict[str, Any]) -> None:
    """400 naming the first field set to something other than its no-op value."""
    for name, noop in refused.items():
        value = getattr(body, name, None)
        if value is not None and value != noop and value not in ({}, [], ""):
            raise bad_request(f"{name} is not supported by this server", param=name, code="unsupported_field")


# ---- OpenAI --------------------------------------------------------------------------------
class FunctionDef(_Body):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None


class Tool(_Body):
    type: Literal["function"] = "function"
    function: FunctionDef


class ContentPart(_Body):
    """One part of a message's content: text is read, images refused (no vision), the rest refused."""

    type: str
    text: str | None = None


class FunctionCall(_Body):
    name: str
    arguments: str | dict[str, Any] = "{}"


class ToolCall(_Body):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None


class NamedFunction(_Body):
    name: str


class NamedToolChoice(_Body):
    type: Literal["function"]
    function: NamedFunction


class StreamOptions(_Body):
    include_usage: bool = False


class JsonSchemaFormat(_Body):
    name: str = "response"
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Body):
    type: Literal["text", "json_object", "json_schema"] = "text"
    json_schema: JsonSchemaFormat | None = None


class SamplingFields(_Body):
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0, le=MAX_TOKENS)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    seed: int | None = Field(default=None, ge=0, lt=2**63)
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    repeat_penalty: float | None = Field(default=None, gt=0.0, le=100.0)
    ignore_eos: bool = False  # llama-server extension: generate through end-of-turn tokens
    stop: str | list[str] | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    model: str | None = None
    # known, not supported: refused by name when set (see REFUSED)
    logprobs: bool | int | None = None
    top_logprobs: int | None = None
    logit_bias: dict[str, float] | None = None


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True
    response_format: ResponseFormat | None = None
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high"] | None = None
    modalities: list[str] | None = None
    audio: dict[str, Any] | None = None


class CompletionRequest(SamplingFields):
    prompt: str | list[int]
    max_tokens: int | None = Field(default=16, ge=1, le=MAX_TOKENS)
    echo: bool = False
    parse_special: bool = True  # special texts in the prompt ("<|im_end|>") become their token ids
    best_of: int | None = None
    suffix: str | None = None


# field -> the value that asks for nothing (so sending it is harmless)
REFUSED_CHAT = {"logprobs": False, "top_logprobs": 0, "logit_bias": {}, "audio": {}, "modalities": ["text"]}
REFUSED_COMPLETION = {"logprobs": 0, "top_logprobs": 0, "logit_bias": {}, "best_of": 1, "suffix": ""}


class TokenizeRequest(_Body):
    content: str
    add_special: bool = False
    parse_special: bool = True  # llama-server's default: "<|im_end|>" in content becomes its id
    with_pieces: bool = False


class DetokenizeRequest(_Body):
    tokens: list[int]
