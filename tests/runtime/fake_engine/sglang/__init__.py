"""A stand-in `sglang` package for launcher tests in the main venv (no real SGLang there)."""
