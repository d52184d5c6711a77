"""`hpckit <command> oc20`: datagen, train, describe."""

from __future__ import annotations

from hpckit.common.config import load_config, load_pytorch_config
from hpckit.common.errors import KitError
from hpckit.oc20 import BENCHMARK


def datagen(args) -> int:
    from hpckit.oc20.synthetic import write_dataset

    if args.format != "tfrecord" or args.size is not None or args.height is not None or args.width is not None:
        raise KitError("datagen oc20: --format, --size, --height and --width are CosmoFlow and DeepCAM options; "
                       "OC20's structures are sized by the config's data.synthetic block")
    cfg = load_config(BENCHMARK, args.config or "reference")
    n_train = args.train if args.train is not None else cfg["data"]["n_train"]
    n_valid = args.valid if args.valid is not None else cfg["data"]["n_valid"]
    if args.config is None and (args.train is None or args.valid is None):
        raise KitError("datagen: give --train and --valid, or --config to take the counts from")
    manifest = write_dataset(args.out, cfg, n_train, n_valid, seed=args.seed, workers=args.workers,
                             shuffle_labels=args.shuffle_labels)
    t = manifest["splits"]["train"]
    print(f"hpckit datagen oc20: wrote {n_train} train + {n_valid} validation structures "
          f"(about {t['atoms_mean']:.0f} atoms, {t['edges_mean']:.0f} edges each; LMDB, seed {args.seed}"
          f"{', forces shuffled' if args.shuffle_labels else ''}) to {args.out}")
    return 0


def train(args) -> int:
    from hpckit.oc20.train import train as run_training
    return run_training(args)


def describe(args) -> int:
    from hpckit.oc20.model import describe_rows, parameter_count
    from hpckit.oc20.train import validate_config

    cfg = load_pytorch_config(args, BENCHMARK, "OC20", validate_config)
    m = cfg["model"]
    rows = describe_rows(cfg)
    print(f"OC20 (DimeNet++), config {cfg['name']}: cutoff {m['cutoff']} A, at most "
          f"{cfg['data']['max_neighbors']} neighbours per atom, output energy per structure and forces (N, 3)")
    print(f"{'module':<24} {'what':<70} {'params':>10}")
    for name, text, params in rows:
        print(f"{name:<24} {text:<70} {params:>10}")
    total = sum(p for _, _, p in rows)
    if total != parameter_count(cfg):
        raise KitError(f"module rows sum to {total} parameters, the model has {parameter_count(cfg)}")
    print("output shape: energy (B,), forces (N, 3)")
    print(f"parameters: {total}")
    return 0
