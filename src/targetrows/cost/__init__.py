"""What decoding costs on this machine (NumPy only; models through the `Model` protocol): the
passes' times (`parttimes`), the zero-overhead round and bound (`rounds`), and the calibration
that predicts acceptance and picks the budget (`calibration`, and `draft_free` for the decoders
without a draft)."""
