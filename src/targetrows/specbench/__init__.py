"""Spec-Bench records (NumPy only): prompts in (`questions`, encoded by `chat`), answers out
(`answers`, the library behind `targetrows decode`)."""
