"""CUDA kernel sources (strings for NVRTC), each module with the numpy reference it mirrors."""
