"""Spark integration: a local or remote SparkSession with delta-spark, and the Spark reader.

Nothing here imports pyspark at module import time; install the ``spark`` extra to use it.
"""

__all__: list[str] = []
