"""Deterministic training (`hpckit train --deterministic`, config key `train.deterministic`).

A regression check compares a run with the runs it was calibrated on. If the same seed can
give another loss curve (floating-point sums in another order: parallel reductions,
autotuned kernels, tf.data's interleaving), time to train carries the training's
randomness on top of the system's speed, and a change in epochs hides or fakes a
slowdown. With `train.deterministic: true` the same seed on the same machine and software
stack gives the same weights, the same eval values and the same number of epochs:

* every random draw is seeded from the run's seed, as always (model init, dropout, the
  per-epoch data order of common/run.EpochSampler; the loaders draw nothing else);
* PyTorch: `torch.use_deterministic_algorithms(True)` (an op without a deterministic
  kernel fails instead of running), cuDNN deterministic and not autotuned, cuBLAS with a
  fixed workspace (CUBLAS_WORKSPACE_CONFIG=:4096:8, set before CUDA starts);
* TensorFlow: `tf.config.experimental.enable_op_determinism()` (deterministic kernels and
  tf.data in order), after `keras.utils.set_random_seed`.

The thread count is part of "the same machine": the core plan (common/cores.py) fixes it
per rank. The MLPerf campaign runs (`reframe --repeat N`: seed + i) leave it off, as
submissions are free to run the fastest kernels; the regression checks turn it on.

Ops without a deterministic kernel (the facts below, one place, with where they were read).
An op a model uses that the running framework can only run non-deterministically on the
GPU would make `--deterministic` fail at its first backward, after staging, as a
traceback. Instead, before staging (`apply`, called by common/run.launch), every config key
of IMPLEMENTATION_KEYS is resolved: `auto` picks the kit's own deterministic
implementation where the running framework has no deterministic kernel and the native op
elsewhere; `native` where that op would raise is refused in one line (exit 2); the value
that runs is written back into the config, so `hpckit_config` logs it. Today one op needs
it: CosmoFlow's 3D max pooling under PyTorch before 2.13 (`model.max_pool`,
cosmoflow/model_torch.MaxPool3d; docs/differences-from-reference.md C23).
tests/test_determinism_ops.py walks every model's training step against TORCH_CUDA_RAISING
for each PyTorch release the kit's stacks pin, and TensorFlow CosmoFlow's step against
TF_GPU_RAISING.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from hpckit.common.errors import KitError

# ---------------------------------------------------------------- PyTorch: the facts
#
# Read from the docstring of torch.use_deterministic_algorithms in each release's own
# torch/__init__.py (the wheel of that release; torch.version.git_version names its commit):
# the list that begins "The following normally-nondeterministic operations will throw a
# RuntimeError when mode=True". The releases are those the kit's stacks run: 2.9 (the
# Spack environments, site_profiles/*/spack.yaml py-torch@2.9.0), 2.11 (the GPU machine the
# kit was first tried on, PyTorch 2.11.0+cu130, issue 32), 2.12 (the newest py-torch in
# Spack's builtin repository, spack/spack-packages 1e8cf05 of 2026-07-01:
# repos/spack_repo/builtin/packages/py_torch/package.py:32, so the newest a Spack site can
# build) and 2.13 (the images, requirements/constraints-cpu.txt and
# apps/hpckit/containers/targets.py).
TORCH_RELEASES_READ = {
    # (major, minor): (release, git commit of its build, lines of the raising list)
    (2, 9): ("2.9.0", "0fabc3ba44823f257e70ce397d989c8de5e362c1", "torch/__init__.py:1378-1416"),
    (2, 11): ("2.11.0", "70d99e998b4955e0049d13a98d77ae1b14db1f45", "torch/__init__.py:1426-1463"),
    (2, 12): ("2.12.0", "7661cd9c6b841b62b7f411aa52ec51f05457263b", "torch/__init__.py:1434-1471"),
    (2, 13): ("2.13.0", "cf30153c4c131c8164ee7798e5022d810682e2cb", "torch/__init__.py:1436-1472"),
}
_ALL = frozenset(TORCH_RELEASES_READ)

# max_pool3d's CUDA backward: 2.9.0 (torch/__init__.py:1384), 2.11.0 (:1432) and 2.12.0
# (:1440) list `torch.nn.MaxPool3d when attempting to differentiate a CUDA tensor` as
# raising (max_pool3d_with_indices_backward_cuda "does not have a deterministic
# implementation", the error of issue 32); 2.13.0 moves it to the list of ops that "will act
# deterministically when mode=True" (:1434). The first release with a deterministic kernel:
MAX_POOL3D_DETERMINISTIC_SINCE = (2, 13)


@dataclass(frozen=True)
class CudaRaising:
    """One entry of the raising list: its text in the docstring, the autograd nodes
    (type(grad_fn).__name__) and the ATen ops (overload packet names) through which a
    training step runs it, and the releases (of TORCH_RELEASES_READ) whose docstring lists it."""
    doc: str
    nodes: tuple[str, ...] = ()
    ops: tuple[str, ...] = ()
    listed: frozenset = field(default=_ALL)


TORCH_CUDA_RAISING = (
    CudaRaising(":class:`torch.nn.AvgPool3d` when attempting to differentiate a CUDA tensor",
                ("AvgPool3DBackward0",), ("avg_pool3d_backward",)),
    CudaRaising(":class:`torch.nn.AdaptiveAvgPool2d` when attempting to differentiate a CUDA tensor",
                ("AdaptiveAvgPool2DBackward0",), ("_adaptive_avg_pool2d_backward",)),
    CudaRaising(":class:`torch.nn.AdaptiveAvgPool3d` when attempting to differentiate a CUDA tensor",
                ("AdaptiveAvgPool3DBackward0",), ("_adaptive_avg_pool3d_backward",)),
    CudaRaising(":class:`torch.nn.MaxPool3d` when attempting to differentiate a CUDA tensor",
                ("MaxPool3DWithIndicesBackward0",), ("max_pool3d_with_indices_backward",),
                frozenset({(2, 9), (2, 11), (2, 12)})),
    CudaRaising(":class:`torch.nn.AdaptiveMaxPool2d` when attempting to differentiate a CUDA tensor",
                ("AdaptiveMaxPool2DBackward0",), ("adaptive_max_pool2d_backward",)),
    CudaRaising(":class:`torch.nn.FractionalMaxPool2d` when attempting to differentiate a CUDA tensor",
                ("FractionalMaxPool2DBackward0",), ("fractional_max_pool2d_backward",)),
    CudaRaising(":class:`torch.nn.FractionalMaxPool3d` when attempting to differentiate a CUDA tensor",
                ("FractionalMaxPool3DBackward0",), ("fractional_max_pool3d_backward",)),
    CudaRaising(":class:`torch.nn.MaxUnpool1d`", ("MaxUnpool2DBackward0",), ("max_unpool2d",)),
    CudaRaising(":class:`torch.nn.MaxUnpool2d`", ("MaxUnpool2DBackward0",), ("max_unpool2d",)),
    CudaRaising(":class:`torch.nn.MaxUnpool3d`", ("MaxUnpool3DBackward0",), ("max_unpool3d",)),
    CudaRaising(":func:`torch.nn.functional.interpolate` when attempting to differentiate a CUDA tensor "
                "and one of the following modes is used: - ``linear`` - ``bilinear`` - ``bicubic`` - "
                "``trilinear``",
                ("UpsampleLinear1DBackward0", "UpsampleBilinear2DBackward0", "UpsampleBicubic2DBackward0",
                 "UpsampleTrilinear3DBackward0", "UpsampleBilinear2DAaBackward0", "UpsampleBicubic2DAaBackward0"),
                ("upsample_linear1d_backward", "upsample_bilinear2d_backward", "upsample_bicubic2d_backward",
                 "upsample_trilinear3d_backward", "_upsample_bilinear2d_aa_backward",
                 "_upsample_bicubic2d_aa_backward")),
    CudaRaising(":class:`torch.nn.ReflectionPad1d` when attempting to differentiate a CUDA tensor",
                ("ReflectionPad1DBackward0",), ("reflection_pad1d_backward",)),
    CudaRaising(":class:`torch.nn.ReflectionPad2d` when attempting to differentiate a CUDA tensor",
                ("ReflectionPad2DBackward0",), ("reflection_pad2d_backward",)),
    CudaRaising(":class:`torch.nn.ReflectionPad3d` when attempting to differentiate a CUDA tensor",
                ("ReflectionPad3DBackward0",), ("reflection_pad3d_backward",)),
    # the CUDA kernel alerts only where it reduces: nll_loss2d_forward_out_cuda_template in
    # aten/src/ATen/native/cuda/NLLLoss2d.cu calls alertNotDeterministic under
    # `if (reduction != at::Reduction::None)` (atomicAdd in 'sum'/'mean'); DeepCAM's
    # per-pixel loss is reduction='none' then .mean(), as upstream (seen passing on an H100
    # with 2.11, issue 32). The 1D loss is taken as the docstring says: always.
    CudaRaising(":class:`torch.nn.NLLLoss` when called on a CUDA tensor",
                ("NllLossBackward0", "NllLoss2DBackward0"), ("nll_loss_forward", "nll_loss2d_forward")),
    CudaRaising(":class:`torch.nn.CTCLoss` when attempting to differentiate a CUDA tensor",
                ("CtcLossBackward0",), ("_ctc_loss_backward",)),
    CudaRaising(":class:`torch.nn.EmbeddingBag` when attempting to differentiate a CUDA tensor when ``mode='max'``",
                ("EmbeddingBagBackward0",), ("_embedding_bag_backward", "_embedding_bag_dense_backward")),
    CudaRaising(":func:`torch.Tensor.put_` when ``accumulate=False``", ("PutBackward0",), ("put_", "put")),
    CudaRaising(":func:`torch.Tensor.put_` when ``accumulate=True`` and called on a CUDA tensor",
                ("PutBackward0",), ("put_", "put")),
    CudaRaising(":func:`torch.histc` when called on a CUDA tensor", (), ("histc",)),
    CudaRaising(":func:`torch.bincount` when called on a CUDA tensor and ``weights`` tensor is given",
                (), ("bincount",)),
    CudaRaising(":func:`torch.kthvalue` with called on a CUDA tensor", ("KthvalueBackward0",), ("kthvalue",),
                frozenset({(2, 9)})),
    CudaRaising(":func:`torch.median` with indices output when called on a CUDA tensor",
                ("MedianBackward1",), ("median",)),
    CudaRaising(":func:`torch.nn.functional.grid_sample` when attempting to differentiate a CUDA tensor",
                ("GridSampler2DBackward0", "GridSampler3DBackward0", "CudnnGridSamplerBackward0"),
                ("grid_sampler_2d_backward", "grid_sampler_3d_backward", "cudnn_grid_sampler_backward")),
    CudaRaising(":func:`torch.cumsum` when called on a CUDA tensor when dtype is floating point or complex",
                ("CumsumBackward0",), ("cumsum", "cumsum_")),
    CudaRaising(":func:`torch.Tensor.scatter_reduce` when ``reduce='prod'`` and called on CUDA tensor",
                ("ScatterReduceBackward0",), ("scatter_reduce", "scatter_reduce_")),
    CudaRaising(":func:`torch.Tensor.resize_` when called with a quantized tensor"),
)


def _node_raises(node) -> bool:
    """The conditions of the entries above that an autograd node carries."""
    name = type(node).__name__
    if name == "NllLoss2DBackward0":
        return getattr(node, "_saved_reduction", 1) != 0
    if name == "ScatterReduceBackward0":
        return getattr(node, "_saved_reduce", "prod") == "prod"
    if name == "EmbeddingBagBackward0":
        return getattr(node, "_saved_mode", 2) == 2      # 0 sum, 1 mean, 2 max
    return True


def _op_raises(op: str, args: tuple, kwargs: dict) -> bool:
    """The conditions of the entries above that an ATen call carries."""
    arg = lambda i, name, default=None: args[i] if len(args) > i else kwargs.get(name, default)  # noqa: E731
    if op == "nll_loss2d_forward":
        return arg(3, "reduction", 1) != 0
    if op in ("scatter_reduce", "scatter_reduce_"):
        return arg(3, "reduce") == "prod"
    if op == "bincount":
        return arg(1, "weights") is not None
    if op == "median":
        return len(args) > 1 or "dim" in kwargs
    if op in ("cumsum", "cumsum_"):
        return bool(args) and getattr(args[0], "dtype", None) is not None and \
            (args[0].dtype.is_floating_point or args[0].dtype.is_complex)
    if op in ("_embedding_bag_backward", "_embedding_bag_dense_backward"):
        return True     # mode is not among its first arguments in every release: taken as raising
    return True


def torch_release(version: str | None = None) -> tuple[int, int, bool]:
    """(major, minor, is_a_release) of a torch version string ('2.11.0+cu130': (2, 11,
    True); '2.13.0a0+git…' or '2.13.0.dev20260101': (2, 13, False), a build before the
    release, which may not hold that release's kernels)."""
    if version is None:
        import torch
        version = torch.__version__
    m = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?([^+]*)", str(version))
    if not m:
        raise KitError(f"torch version {version!r}: not a version number")
    return int(m.group(1)), int(m.group(2)), m.group(4) in ("", ".post0", ".post1", ".post2")


def _read_release(version: str | None) -> tuple[int, int]:
    """The release of TORCH_RELEASES_READ whose list applies to `version`: itself, else the
    newest read one before it (a release in between lists at least what the next one
    does: none of the entries above came back once gone)."""
    major, minor, final = torch_release(version)
    have = sorted(TORCH_RELEASES_READ)
    key = (major, minor)
    if not final:       # a pre-release build: the lists of the release before it
        key = (major, minor - 1) if minor else (major - 1, 99)
    older = [r for r in have if r <= key]
    return older[-1] if older else have[0]


def torch_cuda_raising(version: str | None = None) -> list[CudaRaising]:
    """The entries the docstring of `version` (default: the running torch) lists."""
    release = _read_release(version)
    return [e for e in TORCH_CUDA_RAISING if release in e.listed]


def raising_nodes(nodes, version: str | None = None) -> list[tuple[str, str]]:
    """(node name, docstring entry) for each autograd node whose CUDA kernel raises under
    torch.use_deterministic_algorithms(True) in `version`."""
    by_node = {n: e for e in torch_cuda_raising(version) for n in e.nodes}
    return [(type(n).__name__, by_node[type(n).__name__].doc) for n in nodes
            if type(n).__name__ in by_node and _node_raises(n)]


def raising_ops(calls, version: str | None = None) -> list[tuple[str, str]]:
    """(ATen op, docstring entry) for each (op, args, kwargs) call that raises on CUDA under
    torch.use_deterministic_algorithms(True) in `version`."""
    by_op = {o: e for e in torch_cuda_raising(version) for o in e.ops}
    return [(op, by_op[op].doc) for op, args, kwargs in calls if op in by_op and _op_raises(op, args, kwargs)]


def torch_max_pool3d_deterministic_on_cuda(version: str | None = None) -> bool:
    major, minor, final = torch_release(version)
    return (major, minor) > MAX_POOL3D_DETERMINISTIC_SINCE or \
        ((major, minor) == MAX_POOL3D_DETERMINISTIC_SINCE and final)


# ---------------------------------------------------------------- TensorFlow: the facts
#
# Under tf.config.experimental.enable_op_determinism a GPU kernel without a deterministic
# implementation raises tf.errors.UnimplementedError. Its messages, as built into the GPU
# wheels of the releases the kit's stacks run (PyPI tensorflow 2.21.0, the images'; 2.17.1,
# the CUDA Spack environments'; the same list in both, read from their
# tensorflow/libtensorflow_cc.so.2), name these op types:
TF_GPU_RAISING = {
    "AdjustContrast": "A deterministic GPU implementation of AdjustContrast is not currently available.",
    "AdjustContrastv2": "A deterministic GPU implementation of AdjustContrastv2 is not currently available.",
    "DepthwiseConv2dNativeBackpropFilter": "... not available with this version of cuDNN (before 7.6.3)",
    "ResizeNearestNeighborGrad": "A deterministic GPU implementation of ResizeNearestNeighborGrad is not "
                                 "currently available.",
    "SparseTensorDenseMatMul": "A deterministic GPU implementation of SparseTensorDenseMatmulOp is not "
                               "currently available.",
    "FusedBatchNormGrad": "A deterministic GPU implementation of fused batch-norm backprop, when training "
                          "is disabled, is not currently available.",
    "FusedBatchNormGradV2": "(as FusedBatchNormGrad)",
    "FusedBatchNormGradV3": "(as FusedBatchNormGrad)",
    "DebugNumericSummaryV2": "Determinism is not yet supported for DebugNumericSummaryV2 (CONCISE_HEALTH, "
                             "FULL_HEALTH)",
    "Dilation2DBackpropFilter": "Determinism is not yet supported for Dilation2DBackpropFilter.",
    "Dilation2DBackpropInput": "Determinism is not yet supported for Dilation2DBackpropInput.",
    "MaxPoolGradWithArgmax": "Determinism is not yet supported for MaxPoolGradWithArgmax.",
    "Bincount": "Determinism is not yet supported in GPU implementation of Bincount.",
    "DenseBincount": "Determinism is not yet supported in GPU implementation of DenseBincount.",
    "FakeQuantWithMinMaxVarsGradient": "Determinism is not yet supported in GPU implementation of "
                                       "FakeQuantWithMinMaxVarsGradient.",
    "FakeQuantWithMinMaxVarsPerChannelGradient": "Determinism is not yet supported in GPU implementation of "
                                                 "FakeQuantWithMinMaxVarsPerChannelGradient.",
    "CropAndResizeGradBoxes": "Deterministic GPU implementation of CropAndResizeBackpropBoxes not available.",
    "CropAndResizeGradImage": "Deterministic GPU implementation of CropAndResizeBackpropImage not available.",
    "SegmentSum": "Deterministic GPU implementation of sorted segment reduction op not available.",
    "SegmentProd": "(as SegmentSum)",
    "UnsortedSegmentSum": "Deterministic GPU implementation of unsorted segment reduction op not available.",
    "UnsortedSegmentProd": "(as UnsortedSegmentSum)",
    "SoftmaxCrossEntropyWithLogits": "The GPU implementation of SoftmaxCrossEntropyWithLogits that would have "
                                     "been executed is not deterministic.",
    "SparseSoftmaxCrossEntropyWithLogits": "(as SoftmaxCrossEntropyWithLogits)",
    "Timestamp": "Timestamp cannot be called when determinism is enabled",
}
# Scatter ops on reference (TF1) variables and random ops without a seed raise too (the kit
# has neither: resource variables, keras.utils.set_random_seed). The max-pooling gradients,
# MaxPool3DGrad included, are not on the list: on the GPU they run cuDNN's pooling backward,
# and under op determinism XLA's stream executor asks cuDNN for CUDNN_POOLING_MAX_DETERMINISTIC
# (third_party/xla/xla/stream_executor/cuda/cuda_dnn.cc, CudnnPoolingDescriptor:
# `RequireCudnnDeterminism(...) ? CUDNN_POOLING_MAX_DETERMINISTIC : CUDNN_POOLING_MAX`;
# NVIDIA/framework-reproducibility doc/d9m/tensorflow_status.md "cuDNN Max-Pooling": TF 2.8+
# with enable_op_determinism). Compiled by XLA (tf.function(jit_compile=True), Keras
# compile(jit_compile=...)) they are not: tensorflow/compiler/tf2xla/kernels/pooling_ops.cc
# MaxPoolGradOp raises "GPU MaxPool gradient ops do not yet have a deterministic XLA
# implementation." under OpDeterminismRequired(). So:
TF_XLA_GPU_RAISING = ("MaxPoolGrad", "MaxPoolGradV2", "MaxPool3DGrad")


def tf_raising_ops(op_types, jit_compiled: bool) -> list[str]:
    """The op types of a TensorFlow step that raise on a GPU under op determinism."""
    bad = set(TF_GPU_RAISING) | (set(TF_XLA_GPU_RAISING) if jit_compiled else set())
    return sorted(set(op_types) & bad)


# ---------------------------------------------------------------- choosing before staging

MAX_POOL_CHOICES = ("auto", "native", "deterministic")
IMPLEMENTATION_KEYS = ("model.max_pool",)     # config keys that choose an op's implementation


def max_pool3d_impl(setting: str, device_type: str, deterministic: bool | None = None,
                    torch_version: str | None = None) -> str:
    """'native' (nn.MaxPool3d) or 'deterministic' (cosmoflow/model_torch.first_max_pool3d)
    for `model.max_pool` = `setting` on `device_type`; `deterministic` defaults to the
    running process's torch.are_deterministic_algorithms_enabled()."""
    if setting not in MAX_POOL_CHOICES:
        raise KitError(f"config key 'model.max_pool': {setting!r} is not one of {', '.join(MAX_POOL_CHOICES)}")
    if setting != "auto":
        return setting
    if device_type != "cuda":
        return "native"       # the CPU kernel writes each window's gradient once: deterministic
    if deterministic is None:
        import torch
        deterministic = torch.are_deterministic_algorithms_enabled()
    if deterministic and not torch_max_pool3d_deterministic_on_cuda(torch_version):
        return "deterministic"
    return "native"


def choose_implementations(cfg: dict, framework: str, enabled: bool, device_type: str,
                           torch_version: str | None = None) -> dict:
    """Resolve the IMPLEMENTATION_KEYS present in `cfg` (in place, so the run logs what
    runs) or refuse in one line; no side effect but on `cfg`. Returns {key: value}."""
    chosen = {}
    model = cfg.get("model", {}) if isinstance(cfg, dict) else {}
    if "max_pool" in model:
        setting = model["max_pool"]
        if setting not in MAX_POOL_CHOICES:
            raise KitError(f"config key 'model.max_pool': {setting!r} is not one of {', '.join(MAX_POOL_CHOICES)}")
        if framework == "tensorflow":
            if setting == "deterministic":
                raise KitError("config key 'model.max_pool': deterministic is the PyTorch model's own pooling; "
                               "TensorFlow's MaxPool3DGrad is deterministic on GPUs under --deterministic "
                               "(cuDNN's deterministic max pooling): use auto or native")
            value = "native"
        else:
            value = max_pool3d_impl(setting, device_type, enabled, torch_version)
            if enabled and device_type == "cuda" and value == "native" \
                    and not torch_max_pool3d_deterministic_on_cuda(torch_version):
                import torch
                version = torch_version or torch.__version__
                raise KitError(f"--deterministic with model.max_pool: native: torch {version} has no deterministic "
                               "CUDA backward for MaxPool3d (max_pool3d_with_indices_backward_cuda; deterministic "
                               "from torch 2.13): set model.max_pool to auto or deterministic, or leave "
                               "--deterministic off")
        model["max_pool"] = chosen["model.max_pool"] = value
    return chosen


def apply(framework: str, enabled: bool, device_type: str = "cpu", cfg: dict | None = None) -> dict:
    """Make this process's training deterministic (before any model or data op), or do
    nothing; first resolves `cfg`'s op implementations (choose_implementations: a one-line
    refusal comes before anything is set). Returns what was set, for the log."""
    chosen = choose_implementations(cfg, framework, enabled, device_type) if cfg is not None else {}
    if not enabled:
        return {"deterministic": False, **chosen}
    if framework == "pytorch":
        if device_type == "cuda":
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        import torch
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
        return {"deterministic": True, "how": "torch.use_deterministic_algorithms, cudnn.deterministic", **chosen}
    if framework == "tensorflow":
        import tensorflow as tf
        tf.config.experimental.enable_op_determinism()
        return {"deterministic": True, "how": "tf.config.experimental.enable_op_determinism", **chosen}
    raise KitError(f"--deterministic: no deterministic mode known for framework {framework!r}")
