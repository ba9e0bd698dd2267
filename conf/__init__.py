"""Typed configuration, read once at start-up and passed down. Imports nothing else of Strata's
except its error types, so every layer can depend on it."""

from strata.conf.engine import EngineOptions

__all__ = ["EngineOptions"]
