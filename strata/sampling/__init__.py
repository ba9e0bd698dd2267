"""How the next token is chosen: the parameters a request draws under (params.py) and the chain of small
pure functions that applies them to the logits (sampler.py)."""
