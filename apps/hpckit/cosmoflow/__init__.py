"""CosmoFlow: regress four cosmological parameters from 3D dark-matter histograms."""

from hpckit.common.benchmark import Benchmark, RuleSubstitution

BENCHMARK = "cosmoflow"


def flops_sample(cfg: dict):
    """(model, one sample's forward + backward) on the meta device, for common/flops.py;
    the TensorFlow model is the same layer list (model_spec.py), counted on this twin."""
    import torch
    from hpckit.cosmoflow.model_spec import N_CHANNELS
    from hpckit.cosmoflow.model_torch import CosmoFlow
    s = cfg["data"]["sample_size"]
    with torch.device("meta"):
        model, x = CosmoFlow(cfg), torch.empty(1, s, s, s, N_CHANNELS)
    return model, lambda: model(x).float().sum().backward()


# The official quality target: validation MAE <= 0.124 (the hpc rules' closed_cosmoflow.yaml).
DESCRIPTOR = Benchmark(
    name=BENCHMARK, metric="eval_error", higher_is_better=False, official_target=0.124,
    target_key="train.target_mae",
    mini_rules=(
        RuleSubstitution(("closed_cosmoflow.yaml", "open_cosmoflow.yaml"), "eval_error",
                         "ATLEAST_ONE_CHECK", "v['value'] <= 0.124 and v['value'] > 0.",
                         "0.124", "train.target_mae"),
        # the official cosmoflow rules have no dataset-size check to replace
    ),
    flops_sample=flops_sample,
    data_layout="train/ and validation/, each *.tfrecord[.gz] or *_data.npy + *_label.npy with files_*.lst")
