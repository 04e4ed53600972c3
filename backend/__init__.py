"""QuietFleet backend: coordinator cores, simulator, Spark job and CLI."""
