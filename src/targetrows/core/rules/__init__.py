"""Selection rules, each defined once: a score per pool node and the kind of tree built from it
(`rule.Rule`); `batch` holds pools as arrays. A rule's module is named for what its rules share
(`root_pool`, `after_t0`); `targetrows.decoding.registry` registers them by name."""
