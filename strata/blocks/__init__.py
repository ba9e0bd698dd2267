"""Shared building blocks (norms, RoPE, attention, MoE dispatch) that architecture files compose."""
