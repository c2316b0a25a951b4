"""Benchmarks and references that measure the method: speed, FLOPs, a PyTorch twin, Qwen3 prefix reuse."""
