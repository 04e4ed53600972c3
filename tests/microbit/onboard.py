"""Run portable edge test functions (tests/edge) on a micro:bit through its raw REPL with microfs.

The board's filesystem is flat and it compiles from source in ~9 KB, so each module under test goes on as
one minified file (``edge.core.x`` imported as ``x``) and each test function is sent and run on its own.
"""
import ast
import os
import re

from firmware.microbit import build

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _flat(text):
    return re.sub(r"from edge\.core\.(\w+) import", r"from \1 import", re.sub(r"from edge\.core import (\w+)", r"import \1", text))


def run_file(serial, test_file, modules):
    """{test name: (passed, output)} for every test function of ``test_file`` run on the board."""
    import microfs
    names = []
    for mod in modules + [os.path.join(ROOT, "tests", "edge", "portable.py")]:
        name = os.path.basename(mod)
        path = os.path.join("/tmp", "qf-onboard-" + name)
        with open(path, "w") as f:
            f.write(build.minify(_flat(open(mod).read())))
        microfs.put(path, name, serial=serial)
        names.append(name)
    src = open(test_file).read()
    tree = ast.parse(src)
    imports = [ast.get_source_segment(src, n) for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    helpers = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef) and not n.name.startswith("test_")}
    results = {}
    for fn in [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")]:
        body = ast.get_source_segment(src, fn)
        used, todo, chosen = set(), [fn], []
        while todo:                     # the helpers a test calls, and theirs
            for n in ast.walk(todo.pop()):
                if isinstance(n, ast.Name) and n.id not in used:
                    used.add(n.id)
                    if n.id in helpers:
                        todo.append(helpers[n.id])
                        chosen.append(ast.get_source_segment(src, helpers[n.id]))
        need = []
        for node, text in zip([n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))], imports):
            names = [a.name for a in node.names if (a.asname or a.name) in used]
            if names and isinstance(node, ast.ImportFrom):
                need.append(_flat("from %s import %s" % (node.module, ", ".join(names))))
        code = "\n".join(need + chosen[::-1] + [body,
                          "%s()" % fn.name, "print('QF-PASS')"])
        try:
            out, err = microfs.execute([build.minify(code)], serial=serial)
        except Exception as e:          # the board's own error text
            out, err = b"", str(e).encode()
        results[fn.name] = (b"QF-PASS" in out, (out + err).decode(errors="replace").strip()[-300:])
    for name in names:
        try:
            microfs.rm(name, serial=serial)
        except IOError:                 # already gone: nothing to clean
            pass
    return results
