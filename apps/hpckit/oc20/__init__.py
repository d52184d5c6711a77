"""OpenCatalyst (OC20 S2EF): predict the forces on the atoms of adsorbate-on-catalyst
structures with DimeNet++ (energy by the network, forces -dE/dpos by autograd)."""

from hpckit.common.benchmark import Benchmark, RuleSubstitution

BENCHMARK = "oc20"


def flops_sample(cfg: dict):
    """(model, one training step on one sample) for the FLOP count (common/flops.py): a
    graph network's FLOPs follow its graph, so it is counted on real tensors, one synthetic
    structure of the config's size (hpckit.oc20.flops)."""
    from hpckit.oc20.flops import flops_sample as sample
    return sample(cfg)


# The official quality target: validation forces MAE <= 0.036 (the hpc rules' closed_oc20.yaml;
# the reference stops at < 0.036, mlperf_forces_trainer.py:552-558); the closed rules fix no
# dataset sizes for OC20, so only the target is replaced in the mini ruleset.
DESCRIPTOR = Benchmark(
    name=BENCHMARK, metric="eval_error", higher_is_better=False, official_target=0.036,
    target_key="train.target_mae",
    mini_rules=(
        RuleSubstitution(("closed_oc20.yaml", "open_oc20.yaml"), "eval_error",
                         "ATLEAST_ONE_CHECK", "v['value'] <= 0.036 and v['value'] > 0.",
                         "0.036", "train.target_mae"),
    ),
    flops_sample=flops_sample,
    data_layout="train/*.lmdb and validation/*.lmdb (s2ef/2M/train and s2ef/all/val_id)")
