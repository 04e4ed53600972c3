"""One SparkSession configured like the job's (RocksDB state store), shared by the job tests."""
import pytest


@pytest.fixture(scope="session")
def job_spark():
    from backend.spark import job
    spark = job.session("local[2]", app="qf-test-job")
    yield spark
    spark.stop()
