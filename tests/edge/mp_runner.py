"""Tiny test runner for the portable edge tests under MicroPython (pytest runs the same files)."""
import sys


def run(paths):
    passed = failed = 0
    for path in paths:
        name = path.split("/")[-1]
        if name.endswith(".py"):
            name = name[:-3]
        mod = __import__(name)
        for attr in sorted(dir(mod)):
            fn = getattr(mod, attr)
            if attr.startswith("test_") and callable(fn):
                try:
                    fn()
                    passed += 1
                except Exception as e:
                    failed += 1
                    print("FAIL %s::%s" % (name, attr))
                    sys.print_exception(e)
    print("micropython: %d passed, %d failed" % (passed, failed))
    return failed


if __name__ == "__main__":
    sys.exit(1 if run(sys.argv[1:]) else 0)
