#!/usr/bin/env python3
"""Convert the real-trace suite (backend/bench/suite.py) into simulator CSV traces: scripts/traces.py [--out DIR] [NAME ...] [--bench DIR]."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from backend.bench.traces import main  # noqa: E402

sys.exit(main())
