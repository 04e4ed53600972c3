"""Entity queries with non-value tolerance (Cheng et al. 2005): range and k-NN, rank and fraction tolerance."""
