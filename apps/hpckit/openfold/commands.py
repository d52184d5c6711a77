"""`hpckit <command> openfold`: datagen, train, describe."""

from __future__ import annotations

from hpckit.common.config import load_pytorch_config
from hpckit.common.errors import KitError
from hpckit.openfold import BENCHMARK


def datagen(args) -> int:
    from hpckit.openfold.synthetic import datagen_command
    return datagen_command(args)


def train(args) -> int:
    from hpckit.openfold.train import train as run_training
    return run_training(args)


def describe(args) -> int:
    from hpckit.openfold.model import describe_rows, parameter_count
    from hpckit.openfold.train import validate_config

    cfg = load_pytorch_config(args, BENCHMARK, "OpenFold", validate_config)
    d = cfg["data"]
    rows = describe_rows(cfg)
    print(f"OpenFold (AlphaFold2), config {cfg['name']}: crop {d['crop_size']} residues, {d['max_msa_clusters']} MSA "
          f"clusters, {d['max_extra_msa']} extra sequences, {d['max_templates']} templates, up to "
          f"{d['num_recycling_iters']} recycling iterations")
    print(f"{'module':<40} {'what':<70} {'params':>10}")
    for name, text, params in rows:
        print(f"{name:<40} {text:<70} {params:>10}")
    total = sum(p for _, _, p in rows)
    if total != parameter_count(cfg):
        raise KitError(f"module rows sum to {total} parameters, the model has {parameter_count(cfg)}")
    print("output: final_atom_positions (B, N, 37, 3) and the heads' logits (pLDDT, distogram, masked MSA, "
          "experimentally resolved)")
    print(f"parameters: {total}")
    return 0
