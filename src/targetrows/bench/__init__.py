"""Benchmarks: our decoders against Hugging Face generation on one pair and machine."""
