"""Result analysis: parse MLPerf HPC result logs and score result sets."""
