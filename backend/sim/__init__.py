"""The discrete-event simulator (DESIGN.md §5): one loop, fleet, relay and summary topologies, workloads, ground truth."""
