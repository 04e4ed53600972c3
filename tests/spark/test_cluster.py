"""The job on a real Spark standalone cluster (master + worker on loopback), against the plain reference.

The driver runs in a subprocess: a process holds one SparkContext, and the other Spark tests share a
``local[2]`` one. Its answers and final state must equal what the in-process reference computed.
"""
import json
import os
import subprocess
import sys
import textwrap

from backend.spark.cluster import Standalone
from backend.spark.spool import Spool
from recorded import FLEET, record

SETTINGS = {"protocol": "adaptive", "period": 5.0, "shrink": 0.05}
DRIVER = textwrap.dedent("""
    import json, sys
    from backend.spark import job
    url, spool, out = sys.argv[1:4]
    spark = job.session(url, app="qf-cluster-test", partitions=2)
    q = job.start(spark, spool, out, %r, %r, available_now=True, status_sources=True)
    q.awaitTermination(240)
    print(json.dumps({"error": str(q.exception()) if q.exception() else None,
                      "executors": spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size()}))
    spark.stop()
""" % (FLEET, SETTINGS))


def test_job_on_a_standalone_cluster_matches_the_reference(tmp_path):
    records, ref = record(SETTINGS, duration=15.0, seed=3)
    spool, out = str(tmp_path / "spool"), str(tmp_path / "out")
    with Spool(spool, fsync="never") as sp:
        sp.append(records)
    with Standalone(str(tmp_path / "cluster"), workers=1, cores=2) as cluster:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.getcwd()] + sys.path))
        p = subprocess.run([sys.executable, "-c", DRIVER, cluster.url, spool, out], env=env,
                           capture_output=True, text=True, timeout=400)
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads(p.stdout.strip().splitlines()[-1])
    assert res["error"] is None, res["error"]
    assert res["executors"] >= 2            # the driver and the worker's executor: not local mode
    from backend.spark import job
    answers = job.read_answers(out)
    assert answers and answers == ref["answers"]
    with open(os.path.join(out, "status.json")) as f:
        status = json.load(f)["groups"][FLEET]
    assert status["records"] == len(records)
