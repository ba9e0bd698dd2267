"""The constraints one request decodes under, in the order their masks apply: the reasoning budget (which
may force </think>) before the JSON grammar (whose mask the grammar's thread computes ahead)."""

from __future__ import annotations

from concurrent.futures import Executor

from strata.constraints.constraint import GrammarConstraint
from strata.constraints.reasoning_budget import ThinkBudget
from strata.runtime.sequence import Constraint
from strata.sched.request import Request
from strata.text.tokenizer import Tokenizer


def request_constraints(req: Request, tokenizer: Tokenizer, masks: Executor) -> list[Constraint]:
    out: list[Constraint] = []
    if req.think_budget is not None:
        out.append(ThinkBudget(tokenizer, req.think_budget, req.in_think))
    if req.grammar is not None:
        out.append(GrammarConstraint(req.grammar, masks))
    return out
