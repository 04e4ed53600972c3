"""backend.spark.zipcache: an unchanged archive is not re-read on importlib.invalidate_caches(), a changed one is."""
import importlib
import sys
import zipfile
import zipimport

import pytest

from backend.spark import zipcache

pytestmark = pytest.mark.skipif(sys.version_info >= (3, 12), reason="Python 3.12 re-reads zip archives lazily itself")


def write(path, modules):
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("qfzc/__init__.py", "")
        for name in modules:
            z.writestr("qfzc/%s.py" % name, "NAME = %r\n" % name)


def test_an_unchanged_archive_is_not_read_again_and_a_changed_one_is(tmp_path, monkeypatch):
    archive = str(tmp_path / "lib.zip")
    write(archive, ["a"])
    monkeypatch.syspath_prepend(archive)
    # restored after the test: install patches the class for the whole process (a Spark worker's)
    monkeypatch.setattr(zipimport.zipimporter, "invalidate_caches", zipimport.zipimporter.invalidate_caches)
    monkeypatch.setattr(zipcache, "_READ", {})
    for name in [m for m in sys.modules if m == "qfzc" or m.startswith("qfzc.")]:
        monkeypatch.delitem(sys.modules, name)
    reads = []
    real = zipimport._read_directory
    monkeypatch.setattr(zipimport, "_read_directory", lambda path: reads.append(path) or real(path))
    assert importlib.import_module("qfzc.a").NAME == "a"
    importers = [f for f in sys.path_importer_cache.values() if isinstance(f, zipimport.zipimporter)
                 and f.archive == archive]
    assert len(importers) >= 2          # the archive's root and its package directory

    reads.clear()
    importlib.invalidate_caches()       # Python 3.11 itself: every importer re-reads the archive
    assert len(reads) == len(importers)

    zipcache.install()
    zipcache.install()                  # idempotent
    reads.clear()
    importlib.invalidate_caches()       # the first time after install: read once for all its importers
    importlib.invalidate_caches()
    assert reads == [archive]
    reads.clear()
    for _ in range(3):
        importlib.invalidate_caches()   # unchanged: never read again
    assert reads == []

    write(archive, ["a", "b"])          # changed (size): read again, and what it gained imports
    importlib.invalidate_caches()
    assert reads == [archive]
    assert importlib.import_module("qfzc.b").NAME == "b"
