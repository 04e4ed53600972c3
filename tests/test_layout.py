"""The house rules of the layout (DESIGN.md §2): no import cycle among project modules, no file over 400 lines,
every module says first what it is.

Imports are read from the source (module-level and those inside functions alike: a lazy import still ties
two modules together), so nothing is imported here.
"""
import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("backend", "edge", "firmware")              # importable project code
LIMITED = PACKAGES + ("scripts", "tests", "hil_tests")  # every .py file here stays within MAX_LINES
MAX_LINES = 400
VENDORED = (os.path.join("edge", "runtime", "micropython", "umqtt"),)     # third-party code, kept as shipped


def _files(tops):
    for top in tops:
        for d, dirs, files in os.walk(os.path.join(ROOT, top)):
            dirs[:] = sorted(x for x in dirs if x != "__pycache__")
            for f in sorted(files):
                if f.endswith(".py"):
                    yield os.path.join(d, f)


def modules():
    """{dotted module name: path} of the importable project code."""
    out = {}
    for path in _files(PACKAGES):
        name = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
        out[name[:-len(".__init__")] if name.endswith(".__init__") else name] = path
    return out


def imports(name, path, mods):
    """The project modules that module ``name`` imports anywhere in its source."""
    base = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    deps = set()
    for node in ast.walk(ast.parse(open(path).read(), path)):
        if isinstance(node, ast.Import):
            deps.update(a.name for a in node.names if a.name in mods)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = base.split(".")[:len(base.split(".")) - node.level + 1]
                mod = ".".join(parts + ([node.module] if node.module else []))
            else:
                mod = node.module
            for a in node.names:
                if mod + "." + a.name in mods:
                    deps.add(mod + "." + a.name)        # ``from package import module``
                elif mod in mods:
                    deps.add(mod)
    deps.discard(name)
    return deps


def cycles(graph):
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, on, stack, out = {}, {}, set(), [], []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle():
    mods = modules()
    assert "backend.host" in mods and "edge.agent" in mods
    graph = {m: imports(m, p, mods) for m, p in mods.items()}
    assert graph["backend.live.fleet"] >= {"backend.live.checker"}     # lazy imports count
    assert cycles(graph) == []


def test_no_file_over_400_lines():
    long = []
    for path in _files(LIMITED):
        rel = os.path.relpath(path, ROOT)
        if not rel.startswith(VENDORED):
            with open(path) as fh:
                n = sum(1 for _ in fh)
            if n > MAX_LINES:
                long.append("%s: %d lines" % (rel, n))
    assert long == []


def test_every_module_says_what_it_is():
    """A docstring first (or, on the boards' own files, where a docstring costs RAM, a comment)."""
    silent = []
    for path in _files(PACKAGES + ("scripts",)):
        rel = os.path.relpath(path, ROOT)
        text = open(path).read()
        if rel.startswith(VENDORED) or not text.strip():
            continue
        first = text.lstrip().splitlines()[0]
        if first.startswith("#!"):
            first = text.lstrip().splitlines()[1]
        if not (ast.get_docstring(ast.parse(text)) or first.startswith("#")):
            silent.append(rel)
    assert silent == []


def test_test_modules_have_unique_names():
    """pytest imports test files by their base name (rootdir-relative packages are not used here)."""
    seen = {}
    for path in _files(("tests", "hil_tests")):
        name = os.path.basename(path)
        if name != "conftest.py":
            seen.setdefault(name, []).append(os.path.relpath(path, ROOT))
    assert {n: p for n, p in seen.items() if len(p) > 1} == {}
