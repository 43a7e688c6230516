"""Row logs: the target's rows recorded on its own trajectory (format, recording) and every rule
scored on them."""
