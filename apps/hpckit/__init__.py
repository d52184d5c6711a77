"""hpckit: the MLPerf HPC reproducibility kit (CosmoFlow, DeepCAM)."""

__version__ = "0.1.0"
