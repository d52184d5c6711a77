"""CosmoFlow: regress four cosmological parameters from 3D dark-matter histograms."""

BENCHMARK = "cosmoflow"
