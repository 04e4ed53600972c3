"""Build the micro:bit sensor agent (DESIGN.md §7): its config baked into ``main.py``, a hex with uflash.

``render(cfg)`` checks a config and returns the agent's ``main.py`` text; ``make_hex`` puts a script
into the board's MicroPython filesystem inside the firmware hex with uflash, at the place MicroPython
1.0.1 (Debian's ``firmware-microbit-micropython``) looks for it: the first flash page after the
firmware image (uflash 2's own address is for MicroPython 1.1); ``copy`` puts it on a running board
over the serial line with microfs, as for a real micro:bit. A value is an integer in 1/1024 units of
the reading; ``SCALE`` converts.
"""
import ast
import os

HERE = os.path.dirname(os.path.abspath(__file__))
MODULES = ("qff.py", "qfl.py")       # the filter, the link and loop; main.py holds the config
FIRMWARE = os.environ.get("QF_MICROBIT_FIRMWARE", "/usr/share/firmware-microbit-micropython/firmware.hex")
SCALE = 1024            # device units per value unit (a power of two: conversions are exact)
LIMIT = 1 << 28         # device values stay within ±LIMIT (the agent's ±inf is ±2**29)
DEFAULTS = {"sp": 100, "seed": 1, "start": 20 * SCALE, "step": SCALE // 2, "lo": -LIMIT // 2, "hi": LIMIT // 2,
            "verbose": 1, "sensor": "walk", "status": 2000}
_PAGE = 1024
_FS_END = 0x3F800          # the compass calibration page and the one before it stay free


class MicrobitError(RuntimeError):
    """A bad micro:bit config, a missing firmware hex or a failed copy."""


def config(given=None, **overrides):
    """A complete device config; unknown keys, wrong types and out-of-range values are errors."""
    c = dict(DEFAULTS)
    for src in (given or {}), overrides:
        for k, v in src.items():
            if k not in DEFAULTS:
                raise MicrobitError("unknown micro:bit setting %r (have: %s)" % (k, ", ".join(sorted(DEFAULTS))))
            c[k] = v
    if c["sensor"] not in ("walk", "temp"):
        raise MicrobitError("sensor must be walk (deterministic generator) or temp (the board's thermometer)")
    for k in ("sp", "seed", "start", "step", "lo", "hi", "verbose", "status"):
        if isinstance(c[k], bool) or not isinstance(c[k], int):
            raise MicrobitError("micro:bit setting %s must be an integer, got %r" % (k, c[k]))
    if c["sp"] < 1 or c["status"] < 100 or c["step"] < 0 or not -LIMIT <= c["lo"] <= c["start"] <= c["hi"] <= LIMIT:
        raise MicrobitError("micro:bit config out of range: sp >= 1 ms, status >= 100 ms, lo <= start <= hi within ±2**28")
    return c


def files(cfg=None):
    """{name: text} of the agent with ``cfg`` baked into ``main.py``: what goes on the board."""
    out = {}
    for name in MODULES:
        with open(os.path.join(HERE, name)) as f:
            out[name] = minify(f.read())
    out["main.py"] = "import gc\nimport qff\ngc.collect()\nimport qfl\ngc.collect()\nqfl.main(%r)\n" % (config(cfg),)
    return out


def _docstrings(text):
    """Line numbers (1-based) of the docstrings in ``text``: the board would keep each as a string object."""
    drop = set()
    for node in ast.walk(ast.parse(text)):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef)) and body and len(body) > 1 \
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                and isinstance(body[0].value.value, str):
            drop.update(range(body[0].lineno, body[0].end_lineno + 1))
    return drop


def minify(text):
    """Docstrings, comments and blank lines out, one space per indent level: the board compiles from source
    in ~9 KB."""
    lines = []
    drop = _docstrings(text)
    for i, line in enumerate(text.splitlines(), 1):
        body = line.strip()
        if body and not body.startswith("#") and i not in drop:
            lines.append(" " * ((len(line) - len(line.lstrip())) // 4) + body)
    return "\n".join(lines) + "\n"


def _fs_start(hex_text):
    """First flash page after the firmware's code (below the 0x10000000 UICR), as MicroPython 1.0.1 computes it."""
    top, base = 0, 0
    for line in hex_text.splitlines():
        if not line.startswith(":") or len(line) < 11:
            continue
        n, addr, kind = int(line[1:3], 16), int(line[3:7], 16), int(line[7:9], 16)
        if kind == 4:
            base = int(line[9:13], 16) << 16
        elif kind == 0 and base + addr < 0x40000:
            top = max(top, base + addr + n)
    return (top + _PAGE - 1) // _PAGE * _PAGE


def fs_image(files):
    """The MicroPython 1.0.1 filesystem holding ``files`` {name: bytes}: 128-byte chunks, each file a chain
    (first chunk 0xFE, end offset, name; a chunk's last byte names the next, a later chunk's first byte the
    previous). uflash writes only ``main.py``; the agent is several modules, each compiled on its own."""
    chunks = []
    for name, data in files.items():
        data = name.encode().join([bytes((0xFE, 0, len(name))), data.replace(b"\r\n", b"\n")])
        first = len(chunks)
        pos = 0
        while True:
            room = 127 if len(chunks) == first else 126
            part = data[pos:pos + room]
            pos += room
            head = b"" if len(chunks) == first else bytes((len(chunks),))     # previous chunk's 1-based index
            chunk = bytearray(head + part + b"\xff" * (127 - len(head) - len(part)) + b"\xff")
            chunks.append(chunk)
            if pos >= len(data):
                break
            chunk[127] = len(chunks) + 1
        used = len(head) + len(part)
        end = used - 1
        if used == 127:                                                      # full: an empty chunk ends it
            chunks[-1][127] = len(chunks) + 1
            chunks.append(bytearray(bytes((len(chunks),)) + b"\xff" * 127))
            end = 0
        chunks[first][1] = end
    return b"".join(bytes(c) for c in chunks)


def make_hex(files, out, firmware=FIRMWARE):
    """Write ``out``: the firmware hex with ``files`` ({name: text}) in the board's filesystem (uflash's
    Intel-hex records)."""
    import uflash
    if not os.path.exists(firmware):
        raise MicrobitError("no micro:bit MicroPython firmware at %s: apt-get install firmware-microbit-micropython"
                            % firmware)
    with open(firmware) as f:
        fw = f.read()
    start = _fs_start(fw)
    image = fs_image({k: v.encode() for k, v in files.items()})
    if start + len(image) > _FS_END:
        raise MicrobitError("the agent (%d bytes of filesystem) does not fit the board's %d" % (len(image), _FS_END - start))
    fs = uflash.bytes_to_ihex(start, image) + "\n" + uflash.bytes_to_ihex(_FS_END, b"\xfd") + "\n"
    i = fw.rfind(":020000041000EA")          # the UICR records stay last, as uflash places them
    if i < 0:
        raise MicrobitError("%s is not a micro:bit firmware hex (no UICR record)" % firmware)
    if fw[:i].endswith(":020000040000FA\n"):
        i -= len(":020000040000FA\n")
    with open(out, "w") as f:
        f.write(fw[:i] + fs + fw[i:])
    return out


def copy(port, agent, folder):
    """Put the files ``agent`` ({name: text}) on the board at ``port`` with microfs (written to ``folder``
    first), check they are listed, then soft-reset the board so ``main.py`` starts."""
    import microfs
    import serial
    try:
        with serial.Serial(port, 115200, timeout=1) as s:
            for name, text in sorted(agent.items(), key=lambda kv: kv[0] == "main.py"):
                path = os.path.join(folder, name)
                with open(path, "w") as f:
                    f.write(text)
                microfs.put(path, name, serial=s)
            names = microfs.ls(serial=s)
            s.write(b"\x04")                    # soft reset: main.py starts
    except Exception as e:                      # microfs raises IOError/ValueError with the board's text
        raise MicrobitError("copying the agent to %s failed: %s" % (port, e))
    missing = sorted(set(agent) - set(names))
    if missing:
        raise MicrobitError("%s not on the board after the copy (ls: %s)" % (", ".join(missing), names))
    return names


