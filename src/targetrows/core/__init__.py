"""NumPy-only core: token trees, rows, the candidate pool and its shape, the selection rules
(`rules`), acceptance and verification, prompt lookup, the toy pair, atomic writes."""
