"""DeepCAM: segment extreme-weather features (background, tropical cyclones, atmospheric rivers)
in climate-simulation snapshots with a DeepLabv3+ network."""

BENCHMARK = "deepcam"
