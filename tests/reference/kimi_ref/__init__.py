"""Independent float64 PyTorch reference for kimi-serve (derived from /work/shared fact files)."""
