"""NumPy-only core: token trees, rows, the candidate pool, selection rules, acceptance and
verification, and the toy pair."""
