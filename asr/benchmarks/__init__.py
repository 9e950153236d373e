"""Helpers the benchmarks under `scripts/` share; nothing in `asr` imports this package."""
