"""DeepCAM: segment extreme-weather features (background, tropical cyclones, atmospheric rivers)
in climate-simulation snapshots with a DeepLabv3+ network."""

from hpckit.common.benchmark import Benchmark, RuleSubstitution

BENCHMARK = "deepcam"


def flops_sample(cfg: dict):
    """(model, one sample's forward + backward) on the meta device, for common/flops.py."""
    import torch
    from hpckit.deepcam.model import DeepCAM
    d = cfg["data"]
    with torch.device("meta"):
        model = DeepCAM(cfg)
        x = torch.empty(1, cfg["model"]["n_input_channels"], d["height"], d["width"])
    return model, lambda: model(x).float().sum().backward()


# The official quality target: validation mean IoU >= 0.82 (the hpc rules' closed_deepcam.yaml);
# the closed rules also fix the dataset's sample counts, which the mini ruleset replaces.
DESCRIPTOR = Benchmark(
    name=BENCHMARK, metric="eval_accuracy", higher_is_better=True, official_target=0.82,
    target_key="train.target_iou",
    mini_rules=(
        RuleSubstitution(("closed_deepcam.yaml", "open_deepcam.yaml"), "eval_accuracy",
                         "ATLEAST_ONE_CHECK", "v['value'] >= 0.82 and v['value'] <= 1.",
                         "0.82", "train.target_iou"),
        RuleSubstitution(("closed_deepcam.yaml",), "train_samples", "CHECK",
                         "v['value'] == 121266", "121266", "data.n_train", int),
        RuleSubstitution(("closed_deepcam.yaml",), "eval_samples", "CHECK",
                         "v['value'] == 15158", "15158", "data.n_valid", int),
    ),
    flops_sample=flops_sample,
    data_layout="stats.h5, train/data-*.h5 and validation/data-*.h5")
