"""ThinkBudget: after `budget` tokens inside <think>, only the closing tokens may be drawn."""

from __future__ import annotations

import numpy as np

from strata.constraints.reasoning_budget import ThinkBudget

VOCAB = ["<think>", "</think>", "\n", "a", "b", "c"]


class Tok:
    def encode(self, text: str, add_special: bool = False, parse_special: bool = True) -> list[int]:
        out, i = [], 0
        while i < len(text):
            for tid in sorted(range(len(VOCAB)), key=lambda t: -len(VOCAB[t])):
                if text.startswith(VOCAB[tid], i):
                    out.append(tid)
                    i += len(VOCAB[tid])
                    break
            else:
                raise ValueError(text[i:])
        return out

    def decode(self, ids: list[int]) -> str:
        return "".join(VOCAB[i] for i in ids)


def drive(tb: ThinkBudget, wants: list[int]) -> list[int]:
    """Greedy decode where the model always prefers `wants[step]`; returns what was emitted."""
    out = []
    for w in wants:
        logits = np.zeros(len(VOCAB), np.float32)
        logits[w] = 5.0
        tok = int(np.argmax(tb.mask(logits)))
        tb.advance(tok)
        out.append(tok)
    return out


def test_budget_forces_close_after_n_thinking_tokens() -> None:
    tb = ThinkBudget(Tok(), budget=3, in_think=False)  # type: ignore[arg-type]
    out = drive(tb, [0, 3, 4, 5, 3, 3, 3, 3, 4])
    text = "".join(VOCAB[t] for t in out)
    assert text.startswith("<think>abc\n</think>\n\n")  # 3 thinking tokens, then the forced close
    assert text.endswith("</think>\n\nb") and not tb.inside  # the model resumes after the close


def test_prompt_opened_block_and_natural_close() -> None:
    tb = ThinkBudget(Tok(), budget=10, in_think=True)  # type: ignore[arg-type]
    out = drive(tb, [3, 1, 4, 4])
    assert out == [3, 1, 4, 4]  # the model closed it itself: nothing forced
    assert not tb.inside and tb.used == 1
