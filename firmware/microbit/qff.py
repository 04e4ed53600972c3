# QuietFleet micro:bit filter: Olston et al. 2003 3.1 (bound, shrink, re-check), Cheng et al. 2005 3 (constraints,
# shutdown), DESIGN.md 3 (epochs). Integers only (values in 1/1024 units): a float32 board rounds nothing.
BIG = 1 << 29


class A:
    def __init__(s, tx):
        s.tx = tx
        s.c2 = None         # twice the bound centre
        s.ex = 1            # the centre is exactly the backend's (a reported value), not a bound's rounded ends
        s.h = -1            # half width, -1 infinite
        s.lo = -BIG
        s.hi = BIG
        s.cons = []
        s.mask = 0
        s.ep = 0
        s.v = None
        s.P = 0             # shrink period ms (0: none), factor Q/1024, periods passed, next boundary tick
        s.Q = 1024
        s.per = 0
        s.nxt = 0

    def member(s, c2):
        m = 0
        b = 1
        for l, u in s.cons:
            if 2 * l <= c2 <= 2 * u:
                m |= b
            b <<= 1
        return m

    def place(s):
        h = s.h
        if s.c2 is None or h < 0:
            s.lo, s.hi = -BIG, BIG
            return
        if not s.ex:
            h -= 1          # a centre from a bound's ends is off by less than half a unit
        if h < 0:
            s.lo, s.hi = BIG, -BIG
        else:
            s.lo, s.hi = (s.c2 - 2 * h + 1) // 2, (s.c2 + 2 * h) // 2

    def out(s, v):
        return s.c2 is None or v < s.lo or v > s.hi or (s.cons and s.member(2 * v) != s.mask)

    def report(s, t, why):
        # recentre on the current value (calls stay shallow: the board's stack is small)
        if s.v is not None:
            s.c2 = 2 * s.v
            s.ex = 1
            s.mask = s.member(s.c2) if s.cons else 0
            s.place()
        if why >= 0:
            s.tx('R %d %d %d %d' % (t, s.ep, s.v, why))

    def birth(s):
        s.report(0, -1)
        s.tx('B %d %d %s' % (s.ep, s.h, '-' if s.v is None else s.v))

    def shrink(s):
        # W(1-S) rounded down, minus one: never wider than the backend's double mirror
        h = s.h
        if h >= 0 and s.Q < 1024:
            h = ((h * s.Q) >> 10 if h < 1 << 20 else (h >> 10) * s.Q) - 1
            s.h = h if h > 0 else 0
            s.place()

    def tick(s, now, ticks_add):
        s.per += 1
        s.shrink()
        if s.v is not None and s.out(s.v):
            s.report(s.nxt, 1)
        s.nxt = ticks_add(s.nxt, s.P)

    def apply(s, k, a, now):
        if k == 'C':
            s.P, s.Q, s.per, s.nxt = a[0], a[1], a[2] - 1, a[3]
        elif k == 'Q':
            s.birth()
        elif k == 'P':
            s.report(0, -1)
            s.tx('A %d %d %s %d' % (now, s.ep, '-' if s.v is None else s.v, a[0]))
        elif (a[0] - s.ep) & 0xFFFF and (a[0] - s.ep) & 0xFFFF < 0x8000:
            s.ep = a[0]
            s.h = a[1]
            ack = a[2]
            if k == 'W':
                for _ in range(s.per - a[3]):
                    s.shrink()
                s.place()
            elif k == 'L':
                s.lo, s.hi = a[3], a[4]
                if s.lo == -BIG or s.hi == BIG:
                    s.place()
                else:
                    s.c2 = s.lo + s.hi
                    s.ex = 0
            else:
                s.cons = [(a[i], a[i + 1]) for i in range(3, len(a), 2)]
                if s.c2 is not None:
                    s.mask = s.member(s.c2)
                s.place()
            if s.v is not None and (ack or s.out(s.v)):
                s.report(now, 2)
