"""Spark integration: the PySpark ingest and pipeline, the Spark checkpoint engine and its job.
The SparkSession they run on is built by ``session.py`` and a table's s3a settings by ``s3a.py``:
those two only build, so they are in the bottom tier, which ``jobs/`` may import (the Spark
reader, ``jobs/validate/spark_reader.py``, uses them); the rest of this folder runs jobs.

Nothing here imports pyspark at module import time; install the ``spark`` extra to use it.
"""

__all__: list[str] = []
