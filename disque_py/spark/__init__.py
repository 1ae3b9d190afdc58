"""The ``disque`` data source for Apache Spark (PySpark >= 4.2): batch write, batch read, streaming read.

``pip install disque-py[spark]``, then ``spark.read.format("disque")`` (Spark
finds it through the top-level module ``pyspark_disque``). docs/SPARK.md is
the guide; :mod:`.source` holds the data source, :mod:`.options` its options
(checked on the driver), :mod:`.links` the per-node connections. Importing
this package does not import pyspark.
"""
