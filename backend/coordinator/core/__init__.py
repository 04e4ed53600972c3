"""Generic coordinator core: the sans-IO coordinator, bound cache, aggregates, queries, protocol interface."""
