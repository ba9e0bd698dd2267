"""Typed errors. Every user-facing failure is one of these, so the CLI prints one line and the
HTTP layer maps each to the right 4xx/5xx body without guessing from message text."""

from __future__ import annotations


class StrataError(Exception):
    """Base of every error Strata raises on purpose."""


class GGUFError(StrataError):
    """A GGUF file cannot be used; the message names the path and the reason."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


class NotGGUFError(GGUFError):
    """The file does not start with the GGUF magic."""


class UnsupportedVersionError(GGUFError):
    """The GGUF container version is not one we read."""


class TruncatedFileError(GGUFError):
    """Header or tensor data runs past the end of the file."""


class UnknownArchitectureError(GGUFError):
    """`general.architecture` names a model family we do not implement."""


class UnknownQuantTypeError(GGUFError):
    """A tensor uses a ggml type we cannot dequantize."""


class ChecksumError(GGUFError):
    """SHA-256 verification failed."""


class ModelNotFoundError(StrataError):
    """A model path does not exist or the default model could not be fetched."""


class TemplateError(StrataError):
    """The chat template failed to render (including a template's own raise_exception)."""


class ContextOverflowError(StrataError):
    """A prompt plus the requested tokens does not fit the context window."""

    def __init__(self, n_prompt: int, n_ctx: int) -> None:
        super().__init__(f"prompt has {n_prompt} tokens but the context holds {n_ctx}")
        self.n_prompt = n_prompt
        self.n_ctx = n_ctx


class ConfigError(StrataError):
    """A flag or setting has a bad value; the message names the flag and the value."""

    def __init__(self, flag: str, value: object, reason: str) -> None:
        super().__init__(f"{flag}={value!r}: {reason}")
        self.flag = flag
        self.value = value
