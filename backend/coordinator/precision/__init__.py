"""Adaptive precision for aggregate queries (Olston et al. 2003): adaptive, uniform deadband, optimal static."""
