"""Machinery shared by every benchmark: configs, errors, MLPerf logging, staging, summaries."""
