"""Oracle fixtures: downloaded test models and reference outputs computed with transformers fp32.

Tests compare the engine against these, never against the engine's own earlier output.
Build them with `python tests/oracle/build_fixtures.py`; see `assets.py`.
"""
