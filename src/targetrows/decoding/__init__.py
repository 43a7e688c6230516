"""Decoding (NumPy only): the `Model` protocol, the one round loop, its settings, and the
registry of rules and decoders with their planners."""
