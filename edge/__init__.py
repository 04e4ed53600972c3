"""QuietFleet edge: portable agent code for MicroPython and CPython."""
