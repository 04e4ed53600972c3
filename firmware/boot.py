# QuietFleet board boot (DESIGN.md §7): agent modules live in /lib as precompiled .mpy.
import sys

if "/lib" not in sys.path:
    sys.path.append("/lib")
