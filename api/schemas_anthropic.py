"""Request bodies of the Anthropic Messages API, validated with pydantic (see schemas.parse).

Content blocks are one model with every block's fields typed and optional: which fields a block
type needs is checked where the blocks are read (anthropic_messages.to_chat), so an unknown type or
a missing field is a 400 naming the block.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from strata.api.schemas import MAX_TOKENS, _Body


class AnthropicTool(_Body):
    name: str
    description: str | None = None
    input_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})


class ResultPart(_Body):
    """A part of a tool_result's content: text, or an image (refused: no vision)."""

    type: str
    text: str | None = None


class Block(_Body):
    type: str
    text: str | None = None  # text
    thinking: str | None = None  # thinking
    signature: str | None = None
    data: str | None = None  # redacted_thinking
    id: str | None = None  # tool_use
    name: str | None = None
    input: dict[str, Any] | None = None
    tool_use_id: str | None = None  # tool_result
    content: str | list[ResultPart] | None = None
    is_error: bool | None = None


class SystemBlock(_Body):
    type: Literal["text"]
    text: str


class AnthropicMessage(_Body):
    role: Literal["user", "assistant"]
    content: str | list[Block]


class ThinkingConfig(_Body):
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS)


class ToolChoice(_Body):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class OutputFormat(_Body):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(_Body):
    effort: Literal["low", "medium", "high", "max"] | None = None
    format: OutputFormat | None = None


class CountTokensRequest(_Body):
    model: str | None = None
    messages: list[AnthropicMessage] = Field(min_length=1)
    system: str | list[SystemBlock] | None = None
    tools: list[AnthropicTool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: ThinkingConfig | None = None


class MessagesRequest(CountTokensRequest):
    max_tokens: int = Field(ge=1, le=MAX_TOKENS)
    stop_sequences: list[str] | None = None
    stream: bool = False
    temperature: float | None = Field(default=None, ge=0.0, le=1.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0, le=MAX_TOKENS)
    metadata: dict[str, Any] | None = None
    output_config: OutputConfig | None = None
