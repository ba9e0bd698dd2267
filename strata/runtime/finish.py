"""Why a generation ended: the one vocabulary the sequence, the scheduler, the CLI and both HTTP
protocols share, with one map to OpenAI's `finish_reason` and one to Anthropic's `stop_reason`, so no
layer invents its own strings.

The sequence sets EOS, STOP_STRING, LENGTH or CANCELLED itself (strata/runtime/sequence.py); the
scheduler adds ERROR (the window failed) and the HTTP layer TOOL_CALLS (the text parsed as a tool call).
"""

from __future__ import annotations

import enum


class FinishReason(enum.Enum):
    EOS = "eos"  # an end-of-turn token, or a constraint that completed (the JSON object closed)
    STOP_STRING = "stop_string"  # result.stop_string says which
    LENGTH = "length"  # max_tokens, or the context, ran out
    TOOL_CALLS = "tool_calls"
    CANCELLED = "cancelled"  # client went away
    ERROR = "error"  # the window failed; the client gets a 503 with the reason


OPENAI_FINISH = {
    FinishReason.EOS: "stop",
    FinishReason.STOP_STRING: "stop",
    FinishReason.LENGTH: "length",
    FinishReason.TOOL_CALLS: "tool_calls",
    FinishReason.CANCELLED: "stop",
    FinishReason.ERROR: "error",
}
ANTHROPIC_STOP = {
    FinishReason.EOS: "end_turn",
    FinishReason.STOP_STRING: "stop_sequence",
    FinishReason.LENGTH: "max_tokens",
    FinishReason.TOOL_CALLS: "tool_use",
    FinishReason.CANCELLED: "end_turn",
    FinishReason.ERROR: "end_turn",
}
