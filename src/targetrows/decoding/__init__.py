"""Decoding (NumPy only): the `Model` protocol, the one round loop, the decoder registry and the
cost model."""
