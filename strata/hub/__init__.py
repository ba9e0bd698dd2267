"""Where model files come from and whether they are intact: the embedded default model, fetched on first
use (default_model.py), and SHA-256 checks of any GGUF (verify.py)."""
