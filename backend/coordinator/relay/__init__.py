"""Central processing of relay bodies (Zhang et al. 2005 §5)."""
