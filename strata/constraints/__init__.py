"""Constrained decoding on llguidance: JSON Schemas become grammars whose token masks shape sampling.

schema.py compiles a client's schema (response_format, output_config.format, a forced tool call) for
the model's vocabulary (vocab.py); constraint.py masks each step's logits with it; closing.py ends
JSON that max_tokens cut short. reasoning_budget.py is the other constraint: once a <think> block has
run its budget, it forces the block closed.
"""
