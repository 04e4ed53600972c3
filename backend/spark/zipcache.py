"""Zip importers that re-read an archive only when it changed: PySpark's per-task import-cache reset (DESIGN.md §6).

PySpark puts ``pyspark.zip``, py4j's zip and the ``spark-core`` jar on its Python workers' path, and the
worker calls ``importlib.invalidate_caches()`` at the start of every task (``pyspark.worker_util.
setup_spark_files``). On Python 3.11 that makes every ``zipimporter`` (one per package directory inside
those archives, 19 in the job's worker) re-read its whole archive's directory: ~33,000 entries, 165 ms of
CPU per task at load 1 and 270-520 ms at load 4-9, before the task reads a row (measured in the job's
worker; Spark's own no-op floor pays it too). Python 3.12 re-reads lazily (gh-103200). ``install`` gives
3.11 the same effect: an archive whose size and modification time are those of its cached directory is
not read again; a changed one is, as before.
"""
import os
import sys

_READ = {}      # archive -> (mtime_ns, size) when its cached directory was read


def _stamp(path):
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


def install():
    """Patch ``zipimport.zipimporter.invalidate_caches`` in this process (idempotent; nothing on 3.12+)."""
    import zipimport
    if sys.version_info >= (3, 12) or getattr(zipimport.zipimporter.invalidate_caches, "lazy", False):
        return
    reread = zipimport.zipimporter.invalidate_caches

    def invalidate_caches(self):
        stamp = _stamp(self.archive)
        cached = zipimport._zip_directory_cache.get(self.archive)
        if stamp is not None and cached is not None and _READ.get(self.archive) == stamp:
            self._files = cached
            return
        reread(self)
        _READ[self.archive] = stamp
    invalidate_caches.lazy = True
    zipimport.zipimporter.invalidate_caches = invalidate_caches
