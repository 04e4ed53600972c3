"""An emulated MicroPython board on a pseudo-terminal, driven exactly like a serial one (DESIGN.md §7, §9).

The unix port has a raw REPL, but its soft reset (Ctrl-D on an empty raw-REPL line) ends the process.
This relay owns a pty pair and a ``micropython -X heapsize=...`` child on a second pty; it copies bytes
both ways and, when the child exits, prints ``soft reboot`` and starts a fresh one (back in raw REPL
mode if the host had entered it), so ``mpremote connect /dev/pts/N exec|fs cp|run`` works unchanged.
The board's filesystem is a folder (``cwd`` of the child) with ``lib/`` on its path, as on a board.

``python -m firmware.emulator BOARD_DIR [--heap 64k]`` prints the pty path on its first line.
"""
import argparse
import os
import select
import signal
import subprocess
import sys
import tty

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def micropython():
    path = os.path.join(os.path.dirname(sys.executable), "micropython")
    return path if os.path.exists(path) else "micropython"


class Relay:
    def __init__(self, board, heap="64k"):
        self.board = os.path.abspath(board)
        os.makedirs(os.path.join(self.board, "lib"), exist_ok=True)
        self.heap = heap
        self.master, self.slave = os.openpty()
        tty.setraw(self.slave)          # bytes pass untouched, like a UART
        self.port = os.ttyname(self.slave)
        self.raw = False
        self.child = None
        self.inner = None
        self.boots = 0

    def _spawn(self):
        inner, inner_slave = os.openpty()
        tty.setraw(inner_slave)         # no echo, no newline translation: what the port prints arrives as is
        env = dict(os.environ, MICROPYPATH="%s:%s/lib:.frozen" % (self.board, self.board))
        self.child = subprocess.Popen([micropython(), "-X", "heapsize=" + self.heap], stdin=inner_slave,
                                      stdout=inner_slave, stderr=inner_slave, cwd=self.board, env=env,
                                      start_new_session=True)
        os.close(inner_slave)
        self.inner = inner
        self.boots += 1
        if self.raw:
            os.write(inner, b"\x01")    # the host expects the raw-REPL banner after a soft reset

    def _reboot(self):
        if self.child is not None:
            if self.child.poll() is None:
                self.child.kill()
            self.child.wait()
            os.close(self.inner)
            os.write(self.master, b"soft reboot\r\n")
        self._spawn()

    def serve(self, stop=lambda: False):
        self._spawn()
        while not stop():
            try:
                ready, _, _ = select.select([self.master, self.inner], [], [], 0.2)
            except InterruptedError:
                continue
            if self.master in ready:
                data = os.read(self.master, 4096)
                for b in data:
                    if b == 1:
                        self.raw = True
                    elif b == 2:
                        self.raw = False
                os.write(self.inner, data)
            if self.inner in ready:
                try:
                    data = os.read(self.inner, 4096)
                except OSError:         # EIO: the child's side closed, it exited (soft reset)
                    data = b""
                if data:
                    os.write(self.master, data)
                else:
                    self._reboot()
            elif self.child.poll() is not None:
                self._reboot()

    def close(self):
        if self.child is not None and self.child.poll() is None:
            self.child.kill()
            self.child.wait()


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m firmware.emulator", description=__doc__.splitlines()[0])
    p.add_argument("board", help="folder holding the emulated board's filesystem")
    p.add_argument("--heap", default="64k", help="MicroPython heap, like a small board (default 64k)")
    a = p.parse_args(argv)
    relay = Relay(a.board, a.heap)
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
    print(relay.port, flush=True)
    try:
        relay.serve(lambda: bool(stopping))
    except KeyboardInterrupt:
        pass
    finally:
        relay.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
