"""One SparkSession configured like the job's (RocksDB state store), shared by the job tests."""
import pytest


@pytest.fixture(scope="session")
def job_spark():
    from backend.spark import job
    spark = job.session("local[2]", app="qf-test-job")
    yield spark
    spark.stop()


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory):
    """One KRaft Kafka broker on loopback for every Kafka test (each test uses topics of its own);
    the jars come from the project's set-up (fetched here if a fresh clone skipped it)."""
    from backend.spark import kafkabroker
    kafkabroker.ensure_jars()
    broker = kafkabroker.KafkaBroker(str(tmp_path_factory.mktemp("kafka")), partitions=2).start()
    yield broker
    broker.stop()
