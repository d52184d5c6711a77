"""CosmoFlow: regress four cosmological parameters from 3D dark-matter histograms."""

from hpckit.common.benchmark import Benchmark, RuleSubstitution

BENCHMARK = "cosmoflow"

# The official quality target: validation MAE <= 0.124 (the hpc rules' closed_cosmoflow.yaml).
DESCRIPTOR = Benchmark(
    name=BENCHMARK, metric="eval_error", higher_is_better=False, official_target=0.124,
    target_key="train.target_mae",
    mini_rules=(
        RuleSubstitution(("closed_cosmoflow.yaml", "open_cosmoflow.yaml"), "eval_error",
                         "ATLEAST_ONE_CHECK", "v['value'] <= 0.124 and v['value'] > 0.",
                         "0.124", "train.target_mae"),
        # the official cosmoflow rules have no dataset-size check to replace
    ))
