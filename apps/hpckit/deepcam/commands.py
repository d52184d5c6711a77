"""`hpckit <command> deepcam`: datagen, train, describe."""

from __future__ import annotations

from hpckit.common.config import load_config, load_pytorch_config
from hpckit.common.errors import KitError
from hpckit.deepcam import BENCHMARK


def datagen(args) -> int:
    from hpckit.deepcam.synthetic import FULL_HEIGHT, FULL_WIDTH, write_dataset

    if args.format != "tfrecord" or args.size is not None:
        raise KitError("datagen deepcam: --format and --size are CosmoFlow options; DeepCAM writes HDF5 "
                       "of --height x --width")
    height, width, n_train, n_valid = FULL_HEIGHT, FULL_WIDTH, None, None
    if args.config:
        cfg = load_config(BENCHMARK, args.config)
        d = cfg["data"]
        height, width, n_train, n_valid = d["height"], d["width"], d["n_train"], d["n_valid"]
    height = args.height if args.height is not None else height
    width = args.width if args.width is not None else width
    n_train = args.train if args.train is not None else n_train
    n_valid = args.valid if args.valid is not None else n_valid
    if n_train is None or n_valid is None:
        raise KitError("datagen: give --train and --valid, or --config to take the counts from")
    write_dataset(args.out, n_train, n_valid, height=height, width=width, seed=args.seed,
                  workers=args.workers, shuffle_labels=args.shuffle_labels)
    print(f"hpckit datagen deepcam: wrote {n_train} train + {n_valid} validation samples "
          f"({height} x {width} x 16, HDF5, seed {args.seed}"
          f"{', labels shuffled' if args.shuffle_labels else ''}) and stats.h5 to {args.out}")
    return 0


def train(args) -> int:
    from hpckit.deepcam.train import train as run_training
    return run_training(args)


def describe(args) -> int:
    from hpckit.deepcam.model import describe_rows, parameter_count
    from hpckit.deepcam.train import validate_config

    cfg = load_pytorch_config(args, BENCHMARK, "DeepCAM", validate_config)
    rows = describe_rows(cfg)
    d = cfg["data"]
    print(f"DeepCAM (DeepLabv3+, Xception), config {cfg['name']}, input "
          f"({d['n_channels']}, {d['height']}, {d['width']})")
    print(f"{'layer':<52} {'output shape':<22} {'params':>10}")
    for name, shape, params in rows:
        print(f"{name:<52} {str(shape):<22} {params:>10}")
    total = sum(p for _, _, p in rows)
    if total != parameter_count(cfg):
        raise KitError(f"layer rows sum to {total} parameters, the model has {parameter_count(cfg)}")
    print(f"output shape: {rows[-1][1]}")
    print(f"parameters: {total}")
    return 0
