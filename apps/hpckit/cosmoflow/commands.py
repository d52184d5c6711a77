"""`hpckit <command> cosmoflow`: datagen, train, describe."""

from __future__ import annotations

import os

from hpckit.common.config import load_config
from hpckit.common.errors import KitError
from hpckit.cosmoflow import BENCHMARK


def datagen(args) -> int:
    from hpckit.cosmoflow.synthetic import write_dataset

    size, n_train, n_valid = 128, None, None
    if args.config:
        cfg = load_config(BENCHMARK, args.config)
        size, n_train, n_valid = cfg["data"]["sample_size"], cfg["data"]["n_train"], cfg["data"]["n_valid"]
    size = args.size if args.size is not None else size
    n_train = args.train if args.train is not None else n_train
    n_valid = args.valid if args.valid is not None else n_valid
    if n_train is None or n_valid is None:
        raise KitError("datagen: give --train and --valid, or --config to take the counts from")
    manifest = write_dataset(args.out, n_train, n_valid, size=size, seed=args.seed, fmt=args.format,
                             shuffle_labels=args.shuffle_labels, workers=args.workers)
    print(f"hpckit datagen cosmoflow: wrote {n_train} train + {n_valid} validation samples "
          f"({size}^3 x 4, {manifest['format']}, seed {args.seed}"
          f"{', labels shuffled' if args.shuffle_labels else ''}) to {args.out}")
    return 0


def train(args) -> int:
    from hpckit.cosmoflow.train import train as run_training
    return run_training(args)


def describe(args) -> int:
    from hpckit.cosmoflow import model_spec
    from hpckit.cosmoflow.train import choose_framework, validate_config

    cfg = load_config(BENCHMARK, args.config, args.overrides)
    validate_config(cfg)
    args.framework = choose_framework(args.framework)
    rows = (_torch_layers if args.framework == "pytorch" else _keras_layers)(cfg)
    print(f"CosmoFlow, config {cfg['name']}, {args.framework}")
    print(f"{'layer':<44} {'output shape':<24} {'params':>10}")
    for name, shape, params in rows:
        print(f"{name:<44} {str(shape):<24} {params:>10}")
    total = sum(p for _, _, p in rows)
    expected = model_spec.parameter_count(cfg)
    if total != expected:
        raise KitError(f"{args.framework} model has {total} parameters, the reference architecture {expected}")
    print(f"output shape: {rows[-1][1]}")
    print(f"parameters: {total}")
    return 0


def _torch_layers(cfg):
    import torch
    from torch import nn
    from hpckit.cosmoflow.model_torch import CosmoFlow

    s = cfg["data"]["sample_size"]
    with torch.device("meta"):
        model = CosmoFlow(cfg)
        x = torch.empty(1, s, s, s, 4)
    rows = []
    h = x.permute(0, 4, 1, 2, 3)
    for mod in model.features:
        h = mod(h)
        if isinstance(mod, nn.ConstantPad3d):
            continue
        rows.append((_describe_torch(mod), tuple(h.permute(0, 2, 3, 4, 1).shape[1:]), _count(mod)))
    h = h.permute(0, 2, 3, 4, 1).flatten(1)
    rows.append(("Flatten (channels last)", tuple(h.shape[1:]), 0))
    for mod in model.head:
        h = mod(h)
        rows.append((_describe_torch(mod), tuple(h.shape[1:]), _count(mod)))
    rows.append(("Scale x1.2", tuple(h.shape[1:]), 0))
    return rows


def _describe_torch(mod) -> str:
    from torch import nn
    if isinstance(mod, nn.Conv3d):
        return f"Conv3d {mod.in_channels}->{mod.out_channels} k{mod.kernel_size[0]} same"
    if isinstance(mod, nn.Linear):
        return f"Linear {mod.in_features}->{mod.out_features}"
    if isinstance(mod, nn.LeakyReLU):
        return f"LeakyReLU {mod.negative_slope}"
    if isinstance(mod, nn.MaxPool3d):
        return f"MaxPool3d {mod.kernel_size}"
    if isinstance(mod, nn.Dropout):
        return f"Dropout {mod.p}"
    return type(mod).__name__


def _count(mod) -> int:
    return sum(p.numel() for p in mod.parameters())


def _keras_layers(cfg):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    from hpckit.common.native_log import divert_native_stderr
    divert_native_stderr()
    from hpckit.cosmoflow.model_tf import build_model

    model = build_model(cfg)
    return [(f"{type(layer).__name__} {layer.name}", tuple(layer.output.shape[1:]), layer.count_params())
            for layer in model.layers]
