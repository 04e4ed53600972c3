"""A real Spark run gives the simulator's answers bit for bit (DESIGN.md §2): the refined adaptive workload of
tests/backend/drivers.py, spooled as the broker would carry it and run by the job (RocksDB state, the
host pickled between micro-batches, Python workers in other processes with their own hash seeds)."""
import os
import sys

from backend.spark import job
from backend.spark.spool import Spool

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "backend"))
import drivers  # noqa: E402


def test_spark_job_answers_equal_the_simulators_for_refined_adaptive(job_spark, tmp_path):
    case = "adaptive-refined"
    answers, inputs = drivers.record(case)
    records = drivers.spool_records(inputs)
    with Spool(tmp_path / "spool", fsync="never") as sp:
        sp.append(records)
    q = job.start(job_spark, str(tmp_path / "spool"), str(tmp_path / "out"), drivers.FLEET, drivers.settings(case),
                  available_now=True, source_options={"minPartitionRecords": 500, "maxPartitions": 2})
    q.awaitTermination(300)
    assert q.exception() is None
    got = job.read_answers(str(tmp_path / "out"))
    assert len(got) == len(answers) > 100
    assert drivers.fingerprint(got) == drivers.fingerprint(answers)
