# QuietFleet micro:bit link and loop (DESIGN.md 7): framed lines "BODY|FLETCHER16\n" on the UART, a
# stop-and-wait downlink (each gateway frame is acknowledged with K), samples every sp ms, integer time.
import gc
from utime import ticks_ms, ticks_add, ticks_diff, sleep_ms
from microbit import uart
import qff


def ck(b):
    x = y = 0
    for c in b:
        x = (x + c) % 255
        y = (y + x) % 255
    return y << 8 | x


class L:
    def __init__(s, cfg):
        s.cfg = cfg
        s.seq = 0
        s.g = -1
        s.n = 0
        s.err = 0
        s.minf = 99999
        s.x = cfg['seed'] % 65537
        s.val = cfg['start']
        s.run = 1
        s.a = qff.A(s.tx)

    def tx(s, t):
        s.seq = (s.seq + 1) & 0xFFFF
        t = '%s %d %s' % (t[0], s.seq, t[2:])
        uart.write('%s|%04x\n' % (t, ck(bytes(t, 'ascii'))))

    def sample(s, t):
        c = s.cfg
        if c['sensor'] == 'temp':
            import microbit
            v = microbit.temperature() * 1024
        else:
            s.x = (s.x * 75 + 74) % 65537
            v = s.val + s.x % (2 * c['step'] + 1) - c['step']
            if v > c['hi'] or v < c['lo']:
                v = 2 * s.val - v
            s.val = v
        s.n += 1
        a = s.a
        first = a.v is None
        a.v = v
        if c['verbose']:
            s.tx('V %d %d' % (t, v))
        if first:
            a.report(t, 4)
        elif a.out(v):
            a.report(t, 0)


def main(cfg):
    s = L(cfg)
    a = s.a
    a.birth()
    due = st = ticks_ms()
    buf = b''
    while s.run:
        now = ticks_ms()
        if ticks_diff(now, due) >= 0:
            # stamped when taken; a board that fell behind skips grid points instead of bursting
            s.sample(now)
            due = ticks_add(due, cfg['sp'])
            if ticks_diff(now, due) >= 0:
                due = ticks_add(now, cfg['sp'])
            f = gc.mem_free()
            if f < s.minf:
                s.minf = f
            if s.n & 7 == 0 or f < 1024:
                gc.collect()
        if a.P and ticks_diff(now, a.nxt) >= 0:
            a.tick(now, ticks_add)
        d = uart.read()
        if d:
            buf += d
            i = buf.find(b'\n')
            while i >= 0:
                line = buf[:i].strip()
                buf = buf[i + 1:]
                i = buf.find(b'\n')
                try:
                    j = line.find(b'|')
                    if j < 0 or len(line) != j + 5 or int(str(line[j + 1:], 'ascii'), 16) != ck(line[:j]):
                        raise ValueError
                    f = str(line[:j], 'ascii').split()
                    g = int(f[1])
                    if g != s.g:
                        v = [int(x) for x in f[2:]]
                        s.g = g
                        if f[0] == 'Z':
                            s.tx('G 0')
                            s.run = 0
                        else:
                            a.apply(f[0], v, ticks_ms())
                    s.tx('K %d' % g)
                except Exception:
                    s.err += 1
                    s.tx('E %d' % s.err)
            if len(buf) > 120:
                buf = b''
        if ticks_diff(now, st) >= cfg['status']:
            st = now
            gc.collect()
            s.tx('S %d %d %d %d %d' % (now, s.n, gc.mem_free(), s.minf, s.err))
        sleep_ms(4)
