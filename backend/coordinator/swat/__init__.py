"""Wavelet stream summaries and their adaptive replication (Bulut & Singh 2003, SWAT)."""
