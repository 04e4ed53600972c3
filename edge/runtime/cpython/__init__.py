"""CPython runtime (Raspberry Pi class): paho-mqtt shell around edge.agent.Agent (DESIGN.md §7)."""
