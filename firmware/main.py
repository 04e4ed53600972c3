# QuietFleet board main (DESIGN.md §7): run the agent from qf.json; a crash resets the board
# (the watchdog does the same when the loop stalls), so the agent comes back on its own.
import qfboard

try:
    qfboard.run("qf.json")
except Exception as e:
    import sys
    sys.print_exception(e)
    try:
        import machine
        machine.reset()
    except ImportError:
        raise
