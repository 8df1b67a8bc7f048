"""Spark integration: the PySpark ingest and pipeline, the Spark checkpoint engine and its job.
The SparkSession they run on is built by ``delta_mirror.spark_session`` (bottom tier; also
``spark.session`` here, its old name), the Spark reader is ``jobs/validate/spark_reader.py``.

Nothing here imports pyspark at module import time; install the ``spark`` extra to use it.
"""

__all__: list[str] = []
