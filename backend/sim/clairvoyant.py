"""The clairvoyant offline minimum of reports for one source under a fixed bound width.

Knowing the whole trace, a sender may place each bound anywhere; a bound of width W can cover a
run of readings exactly when their range (max − min) is at most W. Greedy segmentation — extend
the current run until its range would exceed W — yields the minimum number of runs (the classic
interval-stabbing exchange argument), i.e. the fewest reports any filter protocol could send.
"""


def minimum_reports(values, width):
    """Fewest reports that keep every reading of ``values`` (in time order) inside a bound of ``width``."""
    it = iter(values)
    try:
        first = next(it)
    except StopIteration:
        return 0
    count, lo, hi = 1, first, first
    for v in it:
        if v < lo:
            lo = v
        elif v > hi:
            hi = v
        if hi - lo > width:
            count += 1
            lo = hi = v
    return count

