"""GGUF container access: our header parser plus the tensor-name and key constants."""

from strata.gguf.reader import GGUFFile, StringArray, TensorInfo

__all__ = ["GGUFFile", "StringArray", "TensorInfo"]
