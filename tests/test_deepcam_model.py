"""DeepCAM model: the reference DeepLabv3+ (parameter count, shapes), the mini variant, config
validation, initialisation, and batch-norm synchronisation groups."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from hpckit.common.config import load_config
from hpckit.common.errors import KitError
from hpckit.deepcam.model import build_model, describe_rows, parameter_count, sync_batchnorm
from ranks import run_ranks

# Upstream's network (mlcommons/hpc deepcam/src/deepCam/architecture/deeplab_xception.py,
# DeepLabv3_plus(n_input=16, n_classes=3, os=16), as train.py builds it) counted on the meta
# device: sum(p.numel() for p in net.parameters()) = 56,454,720, the number its train.py
# prints as "Total number of elements". `_hand_count` below derives it again by hand.
REFERENCE_PARAMETERS = 56_454_720


def _sep(c_in, c_out):        # depthwise 3x3 + pointwise 1x1, no bias
    return 9 * c_in + c_in * c_out


def _bn(c):                   # weight and bias (running stats are buffers)
    return 2 * c


def _middle_block(c):         # 3 x (sep c->c + BN), identity shortcut
    return 3 * (_sep(c, c) + _bn(c))


def _hand_count(c_in=16, n_classes=3, n_middle=16):
    entry = (9 * c_in * 32 + _bn(32)) + (9 * 32 * 64 + _bn(64))
    for a, b in ((64, 128), (128, 256), (256, 728)):
        # shortcut 1x1/2 + BN; sep a->b + BN; sep b->b + BN; sep b->b /2 (no BN)
        entry += a * b + _bn(b) + _sep(a, b) + _bn(b) + _sep(b, b) + _bn(b) + _sep(b, b)
    middle = n_middle * _middle_block(728)
    # exit block: shortcut 1x1 + BN; sep 728->728 + BN; sep 728->1024 + BN; sep 1024->1024
    exit_ = (728 * 1024 + _bn(1024) + _sep(728, 728) + _bn(728) + _sep(728, 1024) + _bn(1024)
             + _sep(1024, 1024))
    exit_ += _sep(1024, 1536) + _bn(1536) + _sep(1536, 1536) + _bn(1536) + _sep(1536, 2048) + _bn(2048)
    aspp = (2048 * 256 + _bn(256)) + 3 * (9 * 2048 * 256 + _bn(256))   # 1x1 and rates 6, 12, 18
    aspp += 2048 * 256 + 2 * 256                                        # pooling: 1x1 + affine
    aspp += 5 * 256 * 256 + _bn(256)                                    # projection
    low = 128 * 48 + _bn(48)
    deconv = 256 * 256 * 9 + _bn(256)
    decoder = (2 * deconv + (9 * 304 * 256 + _bn(256)) + (9 * 256 * 256 + _bn(256))
               + (256 * 256 + 256) + deconv + 256 * n_classes * 9)
    return entry + middle + exit_ + aspp + low + decoder


def _meta_model(cfg):
    with torch.device("meta"):
        return build_model(cfg)


def test_reference_parameter_count_is_upstreams():
    cfg = load_config("deepcam", "reference")
    assert _hand_count() == REFERENCE_PARAMETERS
    assert parameter_count(cfg) == REFERENCE_PARAMETERS
    # The middle flow alone, by hand: 16 blocks x 3 x (3*3*728 + 728*728 + 2*728).
    assert _middle_block(728) == 3 * (9 * 728 + 728 * 728 + 2 * 728) == 1_613_976
    middle = _meta_model(cfg).encoder.middle
    assert len(middle) == 16
    assert sum(p.numel() for p in middle.parameters()) == 16 * 1_613_976


def test_reference_output_shape_on_meta_device():
    cfg = load_config("deepcam", "reference")
    model = _meta_model(cfg)
    with torch.no_grad():
        out = model(torch.empty(1, 16, 768, 1152, device="meta"))
    assert tuple(out.shape) == (1, 3, 768, 1152)


def test_mini_forward_backward_on_cpu():
    cfg = load_config("deepcam", "mini")
    d = cfg["data"]
    torch.manual_seed(0)
    model = build_model(cfg).train()
    x = torch.randn(2, d["n_channels"], d["height"], d["width"])
    y = torch.randint(0, cfg["model"]["n_classes"], (2, d["height"], d["width"]))
    seen = {}
    for name in ("block1", "exit_block"):
        getattr(model.encoder, name).register_forward_hook(
            lambda _m, _i, o, name=name: seen.__setitem__(name, o.detach()))
    out = model(x)
    # Upstream's in-place ReLU on the aliased block1 output: the low-level features and block2
    # see ReLU(block1). The exit block ends without a ReLU.
    assert seen["block1"].min() >= 0 and seen["block1"].max() > 0
    assert seen["exit_block"].min() < 0
    assert out.shape == (2, 3, d["height"], d["width"])
    assert torch.isfinite(out).all()
    nn.functional.cross_entropy(out, y).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None, name
        assert torch.isfinite(p.grad).all(), name
    # A parameter that gets no signal would be a wiring mistake (e.g. a branch left out).
    assert all(p.grad.abs().sum() > 0 for p in model.parameters())


@pytest.mark.parametrize("name,width", [("reference", 728), ("mini", 128)])
def test_middle_blocks_change_the_count_by_one_block_each(name, width):
    cfg = load_config("deepcam", name)
    n = cfg["model"]["middle_blocks"]
    base = parameter_count(cfg)
    for delta in (-1, 1, 3):
        other = load_config("deepcam", name, [f"model.middle_blocks={n + delta}"])
        assert parameter_count(other) - base == delta * _middle_block(width)


@pytest.mark.parametrize("name", ["reference", "mini"])
def test_describe_rows_partition_the_parameters(name):
    cfg = load_config("deepcam", name)
    m, d = cfg["model"], cfg["data"]
    rows = describe_rows(cfg)
    assert sum(params for _, _, params in rows) == parameter_count(cfg)
    assert len(rows) == 5 + m["middle_blocks"] + 4 + (1 + len(m["aspp_rates"]) + 2) + 1 + 7
    assert rows[0][1] == (m["entry_channels"][0], d["height"] // 2, d["width"] // 2)
    assert rows[-1][1] == (m["n_classes"], d["height"], d["width"])
    stride16 = (d["height"] // 16, d["width"] // 16)
    middle = [r for r in rows if r[0].startswith("middle block")]
    assert len(middle) == m["middle_blocks"]
    assert all(shape == (m["middle_channels"], *stride16) for _, shape, _ in middle)
    assert all(isinstance(desc, str) and desc for desc, _, _ in rows)


@pytest.mark.parametrize("override,key", [
    ("data.height=100", "data.height"),
    ("data.width=1144", "data.width"),
    ("model.output_stride=8", "model.output_stride"),
    ("model.middle_channels=0", "model.middle_channels"),
    ("model.decoder_channels=-4", "model.decoder_channels"),
    ("model.exit_channels=[1024, 1536, 2048]", "model.exit_channels"),
    ("model.entry_block_channels=[128, 0]", "model.entry_block_channels"),
    ("model.aspp_rates=[6, 0]", "model.aspp_rates"),
    ("model.middle_blocks=-1", "model.middle_blocks"),
    ("model.n_input_channels=4", "model.n_input_channels"),
    ("model.batchnorm_group_size=0", "model.batchnorm_group_size"),
])
def test_impossible_values_are_one_line_errors_naming_the_key(override, key):
    cfg = load_config("deepcam", "reference", [override])
    for fn in (build_model, parameter_count, describe_rows):
        with pytest.raises(KitError) as e:
            fn(cfg)
        msg = str(e.value)
        assert f"'{key}'" in msg and "\n" not in msg, msg


def test_initialisation_follows_upstream():
    """Kaiming-normal on the encoder and the ASPP conv branches; PyTorch's default (kaiming-
    uniform, a=sqrt(5): std 1/sqrt(3 fan_in)) on the pooling conv, projection and decoder."""
    torch.manual_seed(0)
    model = build_model(load_config("deepcam", "mini"))

    def ratio(weight, std):
        return weight.std().item() / std

    def fan_in(conv):
        return conv.weight[0].numel()

    kaiming = [model.encoder.middle[0].body[0][1], model.encoder.exit_conv2[0][1], model.aspp.branches[1][0]]
    default = [model.aspp.pool[1], model.aspp.project[0], model.decoder.conv2[0], model.decoder.conv3]
    for conv in kaiming:
        assert abs(ratio(conv.weight, math.sqrt(2 / fan_in(conv))) - 1) < 0.05
    for conv in default:
        assert abs(ratio(conv.weight, 1 / math.sqrt(3 * fan_in(conv))) - 1) < 0.05
    assert model.decoder.conv3.bias is not None and model.decoder.final.bias is None
    for mod in model.modules():
        if isinstance(mod, nn.BatchNorm2d):
            assert torch.equal(mod.weight, torch.ones_like(mod.weight))
            assert torch.equal(mod.bias, torch.zeros_like(mod.bias))
    assert not any(isinstance(m, nn.BatchNorm2d) for m in model.aspp.pool.modules())  # affine, no BN
    affine = model.aspp.pool[2]
    assert torch.equal(affine.weight, torch.ones(64)) and torch.equal(affine.bias, torch.zeros(64))


def _batchnorm_kinds(model):
    plain = sum(type(m) is nn.BatchNorm2d for m in model.modules())
    synced = [m for m in model.modules() if isinstance(m, nn.SyncBatchNorm)]
    return plain, synced


def _one_process_group(rank, port):
    import torch.distributed as dist
    cfg = load_config("deepcam", "mini", ["model.batchnorm_group_size=2"])
    # Not initialised: build_model keeps local batch norm, the helper says what is missing.
    plain, synced = _batchnorm_kinds(_meta_model(cfg))
    assert plain > 0 and not synced
    with pytest.raises(KitError, match="'model.batchnorm_group_size'.*initialised"):
        sync_batchnorm(nn.BatchNorm2d(4), 2)

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        model = build_model(load_config("deepcam", "mini"))          # group size 1
        plain, synced = _batchnorm_kinds(model)
        assert plain > 0 and not synced
        assert sync_batchnorm(model, 1) is model and _batchnorm_kinds(model)[0] == plain
        with pytest.raises(KitError, match="'model.batchnorm_group_size'.*does not divide") as e:
            build_model(cfg)                                          # 2 ranks per group, 1 rank
        assert "\n" not in str(e.value)
    finally:
        dist.destroy_process_group()
    return True


def test_batchnorm_group_size_one_process():
    """In a rank process of its own (tests/ranks.py), not in pytest's: a process that had a
    process group does not go through the interpreter's teardown."""
    import torch.distributed as dist
    if not dist.is_available():
        pytest.skip("torch.distributed is not available")
    assert run_ranks(_one_process_group, 1) == [True]


def _two_ranks(rank, port):
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    model = build_model(load_config("deepcam", "mini", ["model.batchnorm_group_size=2"]))
    synced = [m for m in model.modules() if isinstance(m, nn.SyncBatchNorm)]
    result = {"plain": sum(type(m) is nn.BatchNorm2d for m in model.modules()), "synced": len(synced),
              "groups": sorted({tuple(dist.get_process_group_ranks(m.process_group)) for m in synced})}
    dist.destroy_process_group()
    return result


def test_batchnorm_synchronised_over_two_ranks():
    """Two gloo processes, batchnorm_group_size 2: every batch norm becomes a SyncBatchNorm
    over ranks (0, 1). (SyncBatchNorm's forward needs GPUs; only the conversion runs here.)"""
    import torch.distributed as dist
    if not dist.is_available():
        pytest.skip("torch.distributed is not available")
    n_bn = _batchnorm_kinds(_meta_model(load_config("deepcam", "mini")))[0]
    for res in run_ranks(_two_ranks, 2):
        assert res == {"plain": 0, "synced": n_bn, "groups": [(0, 1)]}, res
