"""An emulated BBC micro:bit (DESIGN.md §7, §9): ``qemu-system-arm -M microbit`` on real MicroPython firmware.

``Board(hex)`` boots the hex with its UART on a pseudo-terminal (``-serial pty``), which pyserial,
microfs and the gateway open exactly like ``/dev/ttyACM0``. A missing QEMU is an error that says how
to install it (the set-up does), never a silent skip.
"""
import atexit
import os
import re
import shutil
import subprocess

from firmware.microbit.build import FIRMWARE, MicrobitError

INSTALL = "apt-get install qemu-system-arm firmware-microbit-micropython (scripts/setup.sh does)"


def qemu():
    path = shutil.which("qemu-system-arm")
    if path is None:
        raise MicrobitError("qemu-system-arm not found: " + INSTALL)
    if not os.path.exists(FIRMWARE):
        raise MicrobitError("no micro:bit firmware at %s: %s" % (FIRMWARE, INSTALL))
    return path


class Board:
    """One QEMU micro:bit process; ``port`` is its UART's pseudo-terminal."""

    def __init__(self, hex_file=FIRMWARE, log=None):
        cmd = [qemu(), "-M", "microbit", "-device", "loader,file=%s" % os.path.abspath(hex_file),
               "-nographic", "-serial", "pty", "-monitor", "none"]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        line = self.proc.stdout.readline().decode(errors="replace")
        m = re.search(r"(/dev/pts/\d+)", line)
        if m is None:
            self.stop()
            raise MicrobitError("qemu-system-arm did not give a pty: %r" % line)
        self.port = m.group(1)
        self.log = log
        atexit.register(self.stop)      # never leave a board behind when the caller crashes

    @property
    def pid(self):
        return self.proc.pid

    def alive(self):
        return self.proc.poll() is None

    def stop(self):
        atexit.unregister(self.stop)
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
