"""The DeepCAM network: DeepLabv3+ on a modified aligned Xception encoder, output stride 16.

Followed: mlcommons/hpc, deepcam/src/deepCam/architecture/deeplab_xception.py (blob 9102bdd0,
imported in b3ccbb3c on 2021-07-05 and unchanged up to 2c627d45, 2025-02-25), built by
deepcam/src/deepCam/train.py as DeepLabv3_plus(n_input=16, n_classes=3, os=16), with the
batch-norm groups of deepcam/src/deepCam/utils/comm.py. This is an independent
implementation of the same function: the same layers in the same order, the same parameter
shapes (but for the ASPP pooling branch's affine: (C,) here, (C, 1, 1) upstream at
deeplab_xception.py:398-408; the same values and count), the same initialisation. With the reference config (16 input channels, 3 classes)
it has 56,454,720 parameters, as upstream's module has.

All convolutions have no bias except the decoder's 1x1 (see below); "sep" is a depthwise
3x3 (padding = dilation) followed by a pointwise 1x1. Widths below are the reference ones,
each one a `model:` key.

Encoder (Xception), input (C, H, W):
  conv1  3x3/2 C->32, BN, ReLU                      H/2
  conv2  3x3   32->64, BN, ReLU
  block1 64->128 /2        \\
  block2 128->256 /2        } entry blocks: 2 sep (+BN, ReLU between, BN after the last),
  block3 256->728 /2       /  a third sep with stride 2 (no BN), plus a 1x1/2 conv + BN
                              shortcut; sum, then ReLU                          H/16
  middle 16 x [728->728: 3 x (sep, BN) with ReLU between; identity shortcut; sum, ReLU]
  exit block 728->1024: sep 728->728, BN, ReLU, sep 728->1024, BN, sep 1024->1024 (no BN);
         shortcut 1x1 conv + BN; sum, no ReLU
  exit convs: sep 1024->1536, 1536->1536, 1536->2048, dilation 2, each + BN, ReLU
ASPP on the 2048 channels: 1x1 -> 256 and 3x3 at rates 6, 12, 18 -> 256, each + BN, ReLU;
  global average -> 1x1 -> 256 -> per-channel affine (no BN) -> ReLU, broadcast to H/16;
  concat (5 x 256) -> 1x1 -> 256, BN, ReLU
Low-level features: the block1 output (H/4, 128 ch) -> 1x1 -> 48, BN, ReLU
Decoder: 2 x [transposed 3x3/2 (padding 1, output_padding 1) -> 256, BN, ReLU]   H/4;
  concat with the 48 low-level channels; 3x3 -> 256, BN, ReLU; 3x3 -> 256, BN, ReLU;
  1x1 -> 256 WITH bias, no BN/ReLU; transposed /2 -> 256, BN, ReLU; transposed /2 ->
  n_classes (no BN, no bias)                                                       H

Upstream details that a plain reading of "DeepLabv3+" would get wrong:
  * block1 is declared without a final ReLU, but upstream takes the low-level features as
    an alias of block1's output and then applies an in-place ReLU to it, so both the
    decoder's low-level branch and block2 see ReLU(block1). Here block1 simply ends with a
    ReLU, which computes the same.
  * The ASPP pooling branch has no batch norm: a trainable per-channel scale and shift
    (upstream `TrainableAffine`, weights 1 and biases 0 at start). Upstream tiles it to a
    fixed 48 x 72 (768 x 1152 inputs); here it is broadcast to the feature map's size,
    which is the same at the reference size and also works at other sizes.
  * Initialisation: kaiming_normal_ (fan_in, gain sqrt 2) on every convolution of the
    encoder and of the four ASPP convolution branches; BN weights 1, biases 0. Upstream's
    decoder and top-level init functions are never called, so the pooling branch's conv,
    the ASPP projection, the low-level 1x1 and the whole decoder keep PyTorch's default
    init. Modules are created in upstream's order, so with the same seed the initial
    weights are the same tensors.
  * Upstream accepts os=8 in the encoder, but its decoder is fixed to /16 -> /4 -> /1 and
    its pooling tile to 48 x 72, so only output stride 16 runs; only 16 is accepted here.

Batch norm can be synchronised over groups of `batchnorm_group_size` consecutive ranks
(`sync_batchnorm`); torch's SyncBatchNorm computes on GPUs only.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from hpckit.common.config import require
from hpckit.common.errors import KitError

OUTPUT_STRIDE = 16       # the only one the reference decoder supports
EXIT_DILATION = 2        # dilation of the three exit separable convs at output stride 16

_LIST_LENGTHS = {"entry_channels": 2, "entry_block_channels": 2, "exit_channels": 4}
_WIDTH_KEYS = ("n_input_channels", "n_classes", "middle_channels", "aspp_channels",
               "decoder_channels", "low_level_channels")


# ----------------------------------------------------------------------------- validation

def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def validate_model_config(cfg: dict) -> None:
    """Raise a one-line KitError naming the first impossible `model.*` / `data.*` value."""
    m, d = cfg["model"], cfg["data"]
    for key in _WIDTH_KEYS:
        require(_is_int(m[key]) and m[key] >= 1, f"model.{key}", f"must be an integer >= 1 (got {m[key]!r})")
    for key, n in _LIST_LENGTHS.items():
        v = m[key]
        require(isinstance(v, list) and len(v) == n and all(_is_int(c) and c >= 1 for c in v),
                f"model.{key}", f"must be a list of {n} integers >= 1 (got {v!r})")
    require(_is_int(m["middle_blocks"]) and m["middle_blocks"] >= 0, "model.middle_blocks",
            f"must be an integer >= 0 (got {m['middle_blocks']!r})")
    rates = m["aspp_rates"]
    require(isinstance(rates, list) and all(_is_int(r) and r >= 1 for r in rates), "model.aspp_rates",
            f"must be a list of integer dilation rates >= 1 (got {rates!r})")
    require(m["output_stride"] == OUTPUT_STRIDE, "model.output_stride",
            f"only {OUTPUT_STRIDE} is supported (the reference decoder upsamples /16 -> /4 -> /1), "
            f"got {m['output_stride']!r}")
    require(_is_int(m["batchnorm_group_size"]) and m["batchnorm_group_size"] >= 1, "model.batchnorm_group_size",
            f"must be an integer >= 1 (got {m['batchnorm_group_size']!r})")
    for key in ("height", "width"):
        v = d[key]
        require(_is_int(v) and v >= OUTPUT_STRIDE and v % OUTPUT_STRIDE == 0, f"data.{key}",
                f"must be a positive multiple of the output stride {OUTPUT_STRIDE} so that the "
                f"decoder returns exactly the input size (got {v!r})")
    require(d["n_channels"] == m["n_input_channels"], "model.n_input_channels",
            f"{m['n_input_channels']} differs from data.n_channels = {d['n_channels']}")


# ----------------------------------------------------------------------------- layers

def _sep(c_in: int, c_out: int, stride: int = 1, dilation: int = 1) -> nn.Sequential:
    """Depthwise 3x3 (padding = dilation, so 'same' at stride 1) then pointwise 1x1, no bias."""
    return nn.Sequential(
        nn.Conv2d(c_in, c_in, 3, stride=stride, padding=dilation, dilation=dilation, groups=c_in, bias=False),
        nn.Conv2d(c_in, c_out, 1, bias=False))


def _conv_bn_relu(c_in: int, c_out: int, kernel: int, stride: int = 1, dilation: int = 1) -> nn.Sequential:
    pad = dilation * (kernel - 1) // 2
    return nn.Sequential(nn.Conv2d(c_in, c_out, kernel, stride=stride, padding=pad, dilation=dilation, bias=False),
                         nn.BatchNorm2d(c_out), nn.ReLU())


def _up_bn_relu(c_in: int, c_out: int) -> nn.Sequential:
    """Transposed 3x3, stride 2, padding 1, output_padding 1: exactly doubles H and W."""
    return nn.Sequential(nn.ConvTranspose2d(c_in, c_out, 3, stride=2, padding=1, output_padding=1, bias=False),
                         nn.BatchNorm2d(c_out), nn.ReLU())


class XceptionBlock(nn.Module):
    """`n_sep` separable convs (each + BN, ReLU between them, none after the last BN), an
    optional trailing separable conv without BN (stride 2 when downsampling), a shortcut
    (1x1 conv + BN when the shape changes, else identity), the sum, an optional ReLU.

    grow_first: the first conv widens c_in -> c_out (else the last one does).
    """

    def __init__(self, c_in: int, c_out: int, n_sep: int, stride: int = 1, dilation: int = 1,
                 grow_first: bool = True, tail: bool = False, relu_out: bool = True):
        super().__init__()
        # Created before the body, as upstream does, so that seeded inits draw alike.
        if c_in != c_out or stride != 1:
            self.shortcut = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False),
                                          nn.BatchNorm2d(c_out))
        else:
            self.shortcut = nn.Identity()
        widths = [c_in] + ([c_out] * n_sep if grow_first else [c_in] * (n_sep - 1) + [c_out])
        body: list[nn.Module] = []
        for i in range(n_sep):
            if i:
                body.append(nn.ReLU())
            body += [_sep(widths[i], widths[i + 1], dilation=dilation), nn.BatchNorm2d(widths[i + 1])]
        if stride != 1 or tail:
            body.append(_sep(c_out, c_out, stride=stride))
        self.body = nn.Sequential(*body)
        self.relu_out = relu_out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.body(x) + self.shortcut(x)
        return torch.relu(y) if self.relu_out else y


class Xception(nn.Module):
    """The modified aligned Xception encoder; returns (features /16, low-level features /4)."""

    def __init__(self, m: dict):
        super().__init__()
        c1, c2 = m["entry_channels"]
        b1, b2 = m["entry_block_channels"]
        mid = m["middle_channels"]
        e_block, e1, e2, e3 = m["exit_channels"]
        self.conv1 = _conv_bn_relu(m["n_input_channels"], c1, 3, stride=2)
        self.conv2 = _conv_bn_relu(c1, c2, 3)
        self.block1 = XceptionBlock(c2, b1, 2, stride=2)     # ReLU at the end: see the module docstring
        self.block2 = XceptionBlock(b1, b2, 2, stride=2)
        self.block3 = XceptionBlock(b2, mid, 2, stride=2)
        self.middle = nn.Sequential(*[XceptionBlock(mid, mid, 3) for _ in range(m["middle_blocks"])])
        self.exit_block = XceptionBlock(mid, e_block, 2, grow_first=False, tail=True, relu_out=False)
        self.exit_conv1 = nn.Sequential(_sep(e_block, e1, dilation=EXIT_DILATION), nn.BatchNorm2d(e1), nn.ReLU())
        self.exit_conv2 = nn.Sequential(_sep(e1, e2, dilation=EXIT_DILATION), nn.BatchNorm2d(e2), nn.ReLU())
        self.exit_conv3 = nn.Sequential(_sep(e2, e3, dilation=EXIT_DILATION), nn.BatchNorm2d(e3), nn.ReLU())
        _kaiming(self)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.conv2(self.conv1(x))
        low = self.block1(x)
        x = self.middle(self.block3(self.block2(low)))
        x = self.exit_block(x)
        x = self.exit_conv3(self.exit_conv2(self.exit_conv1(x)))
        return x, low


class ChannelAffine(nn.Module):
    """y = weight * x + bias per channel (the ASPP pooling branch has this instead of BN)."""

    def __init__(self, channels: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(channels))
        self.bias = nn.Parameter(torch.zeros(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight[:, None, None] + self.bias[:, None, None]


class ASPP(nn.Module):
    """1x1 branch, one dilated 3x3 branch per rate, a global-pooling branch; concat -> 1x1."""

    def __init__(self, c_in: int, c_out: int, rates: list[int]):
        super().__init__()
        branches = []
        for rate in [None, *rates]:     # None: the 1x1 branch (upstream's rate 1)
            branch = _conv_bn_relu(c_in, c_out, 1) if rate is None else _conv_bn_relu(c_in, c_out, 3, dilation=rate)
            _kaiming(branch)             # right after each branch is made, as upstream does
            branches.append(branch)
        self.branches = nn.ModuleList(branches)
        self.pool = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(c_in, c_out, 1, bias=False),
                                  ChannelAffine(c_out), nn.ReLU())
        self.project = _conv_bn_relu((len(branches) + 1) * c_out, c_out, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        outs = [branch(x) for branch in self.branches]
        outs.append(self.pool(x).expand(-1, -1, x.shape[2], x.shape[3]))
        return self.project(torch.cat(outs, dim=1))


class Decoder(nn.Module):
    def __init__(self, c_in: int, c_low: int, c: int, n_classes: int):
        super().__init__()
        self.up1 = _up_bn_relu(c_in, c)
        self.up2 = _up_bn_relu(c, c)
        self.conv1 = _conv_bn_relu(c + c_low, c, 3)
        self.conv2 = _conv_bn_relu(c, c, 3)
        self.conv3 = nn.Conv2d(c, c, 1)             # the one convolution with a bias
        self.up3 = _up_bn_relu(c, c)
        self.final = nn.ConvTranspose2d(c, n_classes, 3, stride=2, padding=1, output_padding=1, bias=False)

    def forward(self, x: torch.Tensor, low: torch.Tensor) -> torch.Tensor:
        x = torch.cat((self.up2(self.up1(x)), low), dim=1)
        x = self.conv3(self.conv2(self.conv1(x)))
        return self.final(self.up3(x))


class DeepCAM(nn.Module):
    """DeepLabv3+: (N, C, H, W) float -> logits (N, n_classes, H, W)."""

    def __init__(self, cfg: dict):
        super().__init__()
        m = cfg["model"]
        self.encoder = Xception(m)
        self.aspp = ASPP(m["exit_channels"][-1], m["aspp_channels"], m["aspp_rates"])
        self.low_level = _conv_bn_relu(m["entry_block_channels"][0], m["low_level_channels"], 1)
        self.decoder = Decoder(m["aspp_channels"], m["low_level_channels"], m["decoder_channels"], m["n_classes"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features, low = self.encoder(x)
        return self.decoder(self.aspp(features), self.low_level(low))


def _kaiming(module: nn.Module) -> None:
    for mod in module.modules():
        if isinstance(mod, nn.Conv2d):
            nn.init.kaiming_normal_(mod.weight)
        elif isinstance(mod, nn.BatchNorm2d):
            nn.init.ones_(mod.weight)
            nn.init.zeros_(mod.bias)


# ----------------------------------------------------------------------------- API

def sync_batchnorm(model: nn.Module, group_size: int) -> nn.Module:
    """Replace every BatchNorm2d by a SyncBatchNorm over groups of `group_size` consecutive
    ranks (0..g-1, g..2g-1, ...). Collective: EVERY rank must call it, with the same
    group_size, because torch.distributed.new_group has to be called by all ranks for every
    group in the same order. group_size 1 returns the model unchanged."""
    key = "model.batchnorm_group_size"
    require(_is_int(group_size) and group_size >= 1, key, f"must be an integer >= 1 (got {group_size!r})")
    if group_size == 1:
        return model
    if not (dist.is_available() and dist.is_initialized()):
        raise KitError(f"config key '{key}': {group_size} needs torch.distributed to be initialised")
    world, rank = dist.get_world_size(), dist.get_rank()
    require(world % group_size == 0, key, f"{group_size} does not divide the number of ranks ({world})")
    mine = None
    for start in range(0, world, group_size):
        ranks = list(range(start, start + group_size))
        group = dist.new_group(ranks=ranks)
        if rank in ranks:
            mine = group
    return nn.SyncBatchNorm.convert_sync_batchnorm(model, process_group=mine)


def build_model(cfg: dict) -> nn.Module:
    """The DeepCAM network of `cfg` (validated). With batchnorm_group_size > 1 and
    torch.distributed initialised, batch norm is synchronised (a collective: all ranks)."""
    validate_model_config(cfg)
    model = DeepCAM(cfg)
    group_size = cfg["model"]["batchnorm_group_size"]
    if group_size > 1 and dist.is_available() and dist.is_initialized():
        model = sync_batchnorm(model, group_size)
    return model


def _build_meta(cfg: dict) -> nn.Module:
    validate_model_config(cfg)
    with torch.device("meta"):
        return DeepCAM(cfg)


def parameter_count(cfg: dict) -> int:
    return sum(p.numel() for p in _build_meta(cfg).parameters())


def _stages(cfg: dict) -> list[tuple[str, str]]:
    """(submodule name, description) for every stage; together they hold every parameter."""
    m = cfg["model"]
    c1, c2 = m["entry_channels"]
    b1, b2 = m["entry_block_channels"]
    mid, (eb, e1, e2, e3) = m["middle_channels"], m["exit_channels"]
    a, dc, low = m["aspp_channels"], m["decoder_channels"], m["low_level_channels"]
    rows = [("encoder.conv1", f"entry conv1 3x3/2 {m['n_input_channels']}->{c1} +BN+ReLU"),
            ("encoder.conv2", f"entry conv2 3x3 {c1}->{c2} +BN+ReLU"),
            ("encoder.block1", f"entry block1 {c2}->{b1} /2 (low-level features)"),
            ("encoder.block2", f"entry block2 {b1}->{b2} /2"),
            ("encoder.block3", f"entry block3 {b2}->{mid} /2")]
    rows += [(f"encoder.middle.{i}", f"middle block {i + 1} {mid}->{mid} 3 sep")
             for i in range(m["middle_blocks"])]
    rows += [("encoder.exit_block", f"exit block {mid}->{eb}"),
             ("encoder.exit_conv1", f"exit sep {eb}->{e1} dil {EXIT_DILATION} +BN+ReLU"),
             ("encoder.exit_conv2", f"exit sep {e1}->{e2} dil {EXIT_DILATION} +BN+ReLU"),
             ("encoder.exit_conv3", f"exit sep {e2}->{e3} dil {EXIT_DILATION} +BN+ReLU"),
             ("aspp.branches.0", f"ASPP 1x1 {e3}->{a} +BN+ReLU")]
    rows += [(f"aspp.branches.{i + 1}", f"ASPP 3x3 rate {r} {e3}->{a} +BN+ReLU")
             for i, r in enumerate(m["aspp_rates"])]
    n_cat = (len(m["aspp_rates"]) + 2) * a
    rows += [("aspp.pool", f"ASPP global pool 1x1 {e3}->{a} +affine+ReLU (broadcast)"),
             ("aspp.project", f"ASPP projection 1x1 {n_cat}->{a} +BN+ReLU"),
             ("low_level", f"low-level 1x1 {b1}->{low} +BN+ReLU"),
             ("decoder.up1", f"decoder convT 3x3/2 {a}->{dc} +BN+ReLU"),
             ("decoder.up2", f"decoder convT 3x3/2 {dc}->{dc} +BN+ReLU"),
             ("decoder.conv1", f"decoder 3x3 {dc}+{low}->{dc} +BN+ReLU"),
             ("decoder.conv2", f"decoder 3x3 {dc}->{dc} +BN+ReLU"),
             ("decoder.conv3", f"decoder 1x1 {dc}->{dc} (bias)"),
             ("decoder.up3", f"decoder convT 3x3/2 {dc}->{dc} +BN+ReLU"),
             ("decoder.final", f"final convT 3x3/2 {dc}->{m['n_classes']} (no bias)")]
    return rows


def describe_rows(cfg: dict) -> list[tuple[str, tuple, int]]:
    """(description, output shape without batch, parameters) per stage, from a forward pass
    on the meta device (no memory, no compute) at data.height x data.width."""
    model = _build_meta(cfg)
    stages = _stages(cfg)
    shapes: dict[str, tuple] = {}
    hooks = []
    for name, _ in stages:
        def record(_mod, _inp, out, name=name):
            shapes[name] = tuple(out.shape[1:])
        hooks.append(model.get_submodule(name).register_forward_hook(record))
    d = cfg["data"]
    try:
        with torch.no_grad():
            model(torch.empty(1, d["n_channels"], d["height"], d["width"], device="meta"))
    finally:
        for hook in hooks:
            hook.remove()
    return [(desc, shapes[name], sum(p.numel() for p in model.get_submodule(name).parameters()))
            for name, desc in stages]
