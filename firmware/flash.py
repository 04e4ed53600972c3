"""``quietfleet flash``: put the agent on a MicroPython board with mpremote, or on a Raspberry Pi as a service.

Board (DESIGN.md §7): build the deploy folder (``firmware.build``), check the port (present? busy?
MicroPython answering?), copy everything with ``mpremote fs cp``, then verify: the board hashes
every file itself (hashlib + ubinascii through ``mpremote exec``) and the digests must equal the
local ones. Every failure says what went wrong and what to do.

Pi: generate a systemd unit and an install script (plus the agent bundle) into a folder; with a
``user@host`` they are copied with scp and run with ssh.
"""
import errno
import io
import json
import os
import shlex
import subprocess
import sys
import tarfile

from firmware import boardconfig, build
from firmware.microbit.build import MicrobitError

ROOT = build.ROOT
MPREMOTE_TIMEOUT = 60


class FlashError(RuntimeError):
    """What went wrong, phrased for the user."""


def serial_ports():
    from serial.tools import list_ports
    return [(p.device, p.description) for p in list_ports.comports()]


def check_port(port):
    """The port exists and nobody holds it; FlashError otherwise, listing the ports that do exist."""
    import serial
    if not os.path.exists(port):
        found = serial_ports()
        hint = ", ".join("%s (%s)" % p for p in found) if found else "none found: is the board plugged in " \
            "(and the USB serial driver loaded)?"
        raise FlashError("serial port %s does not exist. Serial ports present: %s" % (port, hint))
    try:
        s = serial.Serial(port, 115200, timeout=0.2, exclusive=True)
        s.close()
    except serial.SerialException as e:
        text = str(e)
        if getattr(e, "errno", None) in (errno.EBUSY, errno.EAGAIN) or "busy" in text.lower() or \
                "lock" in text.lower() or "temporarily unavailable" in text.lower():
            raise FlashError("serial port %s is busy: another program holds it (a serial monitor, screen, "
                             "minicom, another mpremote). Close it and retry." % port)
        if getattr(e, "errno", None) == errno.EACCES or "permission" in text.lower():
            raise FlashError("no permission to open %s: add yourself to the dialout group "
                             "(sudo usermod -aG dialout $USER, then log in again)" % port)
        raise FlashError("cannot open %s: %s" % (port, text))


def mpremote(port, *args, timeout=MPREMOTE_TIMEOUT):
    """Run ``python -m mpremote connect PORT args...``; returns stdout or raises FlashError."""
    cmd = [sys.executable, "-m", "mpremote", "connect", port, *args]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise FlashError("nothing answered within %ds (a program ignoring Ctrl-C, or not MicroPython)" % timeout)
    if r.returncode:
        err = (r.stderr or r.stdout).strip().splitlines()
        raise FlashError("mpremote %s on %s failed: %s" % (args[0], port, err[-1] if err else "exit %d" % r.returncode))
    return r.stdout


def identify(port, timeout=15):
    """``sys.implementation`` name and platform of the board; FlashError if it is not MicroPython."""
    try:
        out = mpremote(port, "exec", "import sys; print('QF', sys.implementation.name, sys.platform)", timeout=timeout)
    except FlashError as e:
        raise FlashError("no MicroPython REPL on %s: %s. Flash MicroPython first (ESP32: esptool.py write_flash "
                         "0x1000 ESP32_GENERIC.bin; Pico W: hold BOOTSEL, copy the .uf2) and check the port."
                         % (port, e))
    for line in out.splitlines():
        if line.startswith("QF "):
            _, impl, platform = line.split()
            if impl != "micropython":
                break
            return platform
    raise FlashError("the device on %s answered but is not running MicroPython (got %r)" % (port, out.strip()[:200]))


HASH_CODE = """
import hashlib, ubinascii, json
def _h(p):
    h = hashlib.sha256()
    with open(p, 'rb') as f:
        while True:
            b = f.read(512)
            if not b:
                break
            h.update(b)
    return ubinascii.hexlify(h.digest()).decode()
_r = {}
for _p in %s:
    try:
        _r[_p] = _h(_p)
    except OSError:
        _r[_p] = None
print('QFHASH' + json.dumps(_r))
"""


def board_hashes(port, paths):
    out = mpremote(port, "exec", HASH_CODE % json.dumps(paths))
    for line in out.splitlines():
        if line.startswith("QFHASH"):
            return json.loads(line[6:])
    raise FlashError("the board did not return file hashes: %r" % out.strip()[-200:])


def deploy(port, folder):
    """Copy the deploy ``folder`` to the board on ``port`` and verify every file by its hash."""
    local = build.manifest_hashes(folder)
    dirs = sorted({os.path.dirname(p) for p in local if os.path.dirname(p)})
    mk = "import os\nfor d in %s:\n    try:\n        os.mkdir(d)\n    except OSError:\n        pass\n" % json.dumps(
        [d for d in _parents(dirs)])
    mpremote(port, "exec", mk)
    args = []
    for rel in local:
        args += ["fs", "cp", os.path.join(folder, rel), ":" + rel, "+"]
    mpremote(port, *args[:-1], timeout=MPREMOTE_TIMEOUT * 4)
    remote = board_hashes(port, list(local))
    bad = [p for p in local if remote.get(p) != local[p]]
    if bad:
        raise FlashError("verification failed for %d file(s): %s (board has %s). Re-run flash; if it repeats, "
                         "the board's filesystem may be full or corrupt (mpremote fs df)."
                         % (len(bad), ", ".join(bad[:5]), ", ".join(str(remote.get(p))[:12] for p in bad[:5])))
    return local


def _parents(dirs):
    out = []
    for d in dirs:
        parts = d.split("/")
        for i in range(1, len(parts) + 1):
            p = "/".join(parts[:i])
            if p not in out:
                out.append(p)
    return out


# -- Raspberry Pi: CPython agent as a systemd service ---------------------------------------------------
UNIT = """[Unit]
Description=QuietFleet agent {device}
After=network-online.target
Wants=network-online.target

[Service]
Type=simple
User=quietfleet
Group=quietfleet
WorkingDirectory=/var/lib/quietfleet
Environment=PYTHONPATH=/opt/quietfleet/app
ExecStart=/opt/quietfleet/venv/bin/python -m edge.runtime.cpython.runtime /etc/quietfleet/device.toml
Restart=always
RestartSec=5
KillSignal=SIGTERM
TimeoutStopSec=15
NoNewPrivileges=true
ProtectSystem=strict
ProtectHome=true
ReadWritePaths=/var/lib/quietfleet

[Install]
WantedBy=multi-user.target
"""

INSTALL = """#!/bin/sh
# Install the QuietFleet CPython agent as the systemd service quietfleet-agent (run as root on the Pi).
set -eu
cd "$(dirname "$0")"
id quietfleet >/dev/null 2>&1 || useradd --system --home-dir /var/lib/quietfleet --shell /usr/sbin/nologin quietfleet
for g in dialout gpio i2c spi; do getent group "$g" >/dev/null && usermod -aG "$g" quietfleet || true; done
command -v python3 >/dev/null || {{ apt-get update && apt-get install -y python3 python3-venv; }}
python3 -m venv --help >/dev/null 2>&1 || apt-get install -y python3-venv
mkdir -p /opt/quietfleet/app /etc/quietfleet /var/lib/quietfleet
[ -x /opt/quietfleet/venv/bin/python ] || python3 -m venv /opt/quietfleet/venv
/opt/quietfleet/venv/bin/pip install -q {requirements}
rm -rf /opt/quietfleet/app/edge && tar -xzf agent.tar.gz -C /opt/quietfleet/app
install -m 0640 -g quietfleet device.toml /etc/quietfleet/device.toml
chown quietfleet:quietfleet /var/lib/quietfleet
install -m 0644 quietfleet-agent.service /etc/systemd/system/quietfleet-agent.service
systemctl daemon-reload
systemctl enable --now quietfleet-agent.service
systemctl restart quietfleet-agent.service
echo "quietfleet-agent installed: journalctl -u quietfleet-agent -f"
"""
PI_REQUIREMENTS = ("paho-mqtt==2.1.0", "pyserial==3.5")


def pi_bundle(config, out):
    """Write unit, install script, agent bundle and device.toml into ``out``; returns the file names."""
    from edge.runtime.cpython import config as devconfig
    try:
        cfg = devconfig.load(config)
    except (OSError, ValueError) as e:
        raise FlashError("device config %s: %s" % (config, e))
    for name, spec in cfg["sources"].items():
        if "path" in spec:
            raise FlashError("source %s reads a local file (%s): copy it to the Pi and use an absolute path"
                             % (name, spec["path"]))
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "quietfleet-agent.service"), "w") as f:
        f.write(UNIT.format(device=cfg["device"]))
    path = os.path.join(out, "install.sh")
    with open(path, "w") as f:
        f.write(INSTALL.format(requirements=" ".join(shlex.quote(r) for r in PI_REQUIREMENTS)))
    os.chmod(path, 0o755)
    with open(config, "rb") as src, open(os.path.join(out, "device.toml"), "wb") as dst:
        dst.write(src.read())
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for base, dirs, files in os.walk(os.path.join(ROOT, "edge")):
            dirs[:] = [d for d in dirs if d not in ("__pycache__", "micropython")]
            for name in sorted(files):
                if name.endswith(".py"):
                    full = os.path.join(base, name)
                    tar.add(full, arcname=os.path.relpath(full, ROOT))
    with open(os.path.join(out, "agent.tar.gz"), "wb") as f:
        f.write(buf.getvalue())
    return sorted(os.listdir(out))


def pi_install(target, out):
    """Copy the bundle to ``user@host`` and run the install script there with sudo."""
    remote = "/tmp/quietfleet-install"
    for cmd in (["ssh", target, "mkdir -p %s" % remote],
                ["scp", "-q"] + [os.path.join(out, f) for f in sorted(os.listdir(out))] + ["%s:%s/" % (target, remote)],
                ["ssh", target, "sudo sh %s/install.sh" % remote]):
        r = subprocess.run(cmd)
        if r.returncode:
            raise FlashError("%s failed (exit %d): check that `ssh %s` works without a password prompt"
                             % (cmd[0], r.returncode, target))


def microbit_flash(args):
    """``--board microbit``: the sensor agent with its config (a JSON of firmware/microbit/build.py settings)
    as a hex built with uflash's records (``--build-only``: copy it to the board's USB drive), or copied
    with microfs over the serial port (a real board's /dev/ttyACM0 or an emulated board's pty)."""
    from firmware.microbit import build as mbuild
    cfg = {}
    if args.config:
        with open(args.config) as f:
            cfg = json.load(f)
    files = mbuild.files(cfg)
    out = args.out or os.path.join("build", "microbit")
    os.makedirs(out, exist_ok=True)
    hexfile = mbuild.make_hex(files, os.path.join(out, "qf-microbit.hex"))
    print("built %s (%s)" % (hexfile, ", ".join(sorted(files))))
    if args.build_only:
        print("flash: copy %s to the MICROBIT drive" % hexfile)
        return 0
    if not args.port:
        raise FlashError("give --port (the micro:bit's serial port, e.g. /dev/ttyACM0), or --build-only for the hex")
    check_port(args.port)
    names = mbuild.copy(args.port, files, out)
    print("copied to %s with microfs: %s; the board restarted into the agent" % (args.port, ", ".join(names)))
    return 0


def flash_main(args):
    """Entry point of ``quietfleet flash``; returns an exit code."""
    try:
        if args.pi:
            if not args.config:
                raise FlashError("--pi needs --config device.toml (see `quietfleet agent`)")
            out = args.out or "pi-bundle"
            files = pi_bundle(args.config, out)
            print("Pi bundle in %s: %s" % (out, ", ".join(files)))
            if args.build_only:
                print("install: scp %s/* %s:/tmp/q/ && ssh %s sudo sh /tmp/q/install.sh" % (out, args.pi, args.pi))
                return 0
            pi_install(args.pi, out)
            print("installed on %s: systemctl status quietfleet-agent" % args.pi)
            return 0
        if args.board == "microbit":
            return microbit_flash(args)
        if args.config:
            cfg = boardconfig.load(args.config)
            if args.board and cfg.get("board", {}).get("name", args.board) not in (args.board, "pico_w", "rp2"):
                print("warning: config is for board %s, flashing %s" % (cfg["board"]["name"], args.board),
                      file=sys.stderr)
        out = args.out or "build/firmware"
        files = build.build(out, args.config, source=args.source)
        print("built %s (%d files)" % (out, len(files)))
        if args.build_only:
            return 0
        if not args.port:
            ports = serial_ports()
            if len(ports) != 1:
                raise FlashError("give --port: %s" % (
                    "no serial ports found (is the board plugged in?)" if not ports else
                    "several serial ports: " + ", ".join(p for p, _ in ports)))
            args.port = ports[0][0]
        check_port(args.port)
        platform = identify(args.port)
        print("MicroPython on %s (%s)" % (args.port, platform))
        done = deploy(args.port, out)
        print("deployed and verified %d files (sha256 computed on the board); reset the board to start the agent"
              % len(done))
        return 0
    except (FlashError, boardconfig.ConfigError, build.BuildError, MicrobitError) as e:
        print("quietfleet flash: %s" % e, file=sys.stderr)
        return 2
