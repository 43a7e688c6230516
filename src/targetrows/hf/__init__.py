"""The Hugging Face backend (torch): a causal LM as a `Model` with tree attention, EAGLE-3 heads,
loading, and Hugging Face generation as a baseline."""
