"""Analysis: paired gains with bootstrap intervals, and the tables and figures the pipeline writes."""
