"""`--deterministic` on CUDA, guarded without a GPU.

Under torch.use_deterministic_algorithms(True) an op without a deterministic CUDA kernel
raises at its first use; on the GPU machine of issue 32 (PyTorch 2.11) CosmoFlow's max
pooling backward did, after staging, as a traceback. Here one training step of every model
(CosmoFlow and DeepCAM, mini and reference configs; the reference networks on small inputs,
which build the same autograd nodes) in every precision is walked, node by node (autograd
graph) and call by call (ATen ops, backward and optimizer included), against the raising
list of each PyTorch release the kit's stacks run (common/determinism.TORCH_CUDA_RAISING,
read from each release's docstring), with the implementation choices `--deterministic`
makes on CUDA for that release. The CosmoFlow of cf95ba2 (plain nn.MaxPool3d) fails the
walk for 2.9 and 2.11 and passes it for 2.13. The same question for TensorFlow CosmoFlow's
step under enable_op_determinism (common/determinism.TF_GPU_RAISING), and the pooling the
kit substitutes: forward bit-equal to torch's, gradient equal, ties and NaN included.
"""

from __future__ import annotations

import contextlib
import functools
import os
import types

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from conftest import run_hpckit
from hpckit.common import determinism, precision
from hpckit.common.config import load_config
from hpckit.common.errors import KitError

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

# the PyTorch releases the kit's stacks pin: the Spack environments' py-torch@2.9.0
# (site_profiles/*/spack.yaml), the GPU machine's 2.11 (issue 32), the images' 2.13
# (requirements/constraints-cpu.txt, apps/hpckit/containers/targets.py)
STACK_TORCH = ("2.9.0", "2.11.0", "2.13.0")
MODELS = ("cosmoflow-mini", "cosmoflow-reference", "deepcam-mini", "deepcam-reference")
POOL_DOC = ":class:`torch.nn.MaxPool3d` when attempting to differentiate a CUDA tensor"


# ---------------------------------------------------------------- walking a step

class OpLog(TorchDispatchMode):
    """Every ATen call made while active (forward, backward, optimizer)."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
        self.calls.append((func.overloadpacket.__name__, args, kwargs or {}))
        return func(*args, **(kwargs or {}))


def autograd_nodes(root) -> list:
    seen, todo, out = set(), [root], []
    while todo:
        fn = todo.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        out.append(fn)
        todo.extend(f for f, _ in fn.next_functions)
    return out


def _cfg(model: str):
    bench, name = model.split("-")
    cfg = load_config(bench, name)
    if model == "deepcam-mini":     # the mini network on a small input (output stride 16: 1 x 2)
        cfg["data"]["height"], cfg["data"]["width"] = 16, 32
    return cfg


def _fake(model: str, prec: str):
    """The minis in fp32 run for real; the other steps (the reference networks at their
    full size) on fake tensors: torch's FakeTensorMode gives shapes, dtypes, autocast and
    autograd as on real CPU tensors, without the arithmetic (minutes on 2 cores in fp16)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    return contextlib.nullcontext() if model.endswith("mini") and prec == "fp32" else FakeTensorMode()


@functools.lru_cache(maxsize=None)
def _step(model: str, prec: str, max_pool: str, fake: bool | None = None) -> tuple[list, list]:
    """(autograd nodes, ATen calls) of one training step with the model's max pooling
    (CosmoFlow) resolved to `max_pool`: 'native', 'deterministic' or 'cf95ba2' (the model
    of that commit: plain nn.MaxPool3d)."""
    torch.manual_seed(0)
    cfg, cpu = _cfg(model), torch.device("cpu")
    from torch._subclasses.fake_tensor import FakeTensorMode
    with _fake(model, prec) if fake is None else FakeTensorMode() if fake else contextlib.nullcontext():
        return _run_step(model, cfg, prec, max_pool, cpu)


def _run_step(model, cfg, prec, max_pool, cpu):
    scaler = precision.grad_scaler(prec, cpu)
    if model.startswith("cosmoflow"):
        from hpckit.cosmoflow.model_torch import CosmoFlow
        cfg["model"]["max_pool"] = "native" if max_pool == "cf95ba2" else max_pool
        net = CosmoFlow(cfg)
        if max_pool == "cf95ba2":
            for i, mod in enumerate(net.features):
                if isinstance(mod, nn.MaxPool3d):
                    net.features[i] = nn.MaxPool3d(2)
        s = cfg["data"]["sample_size"]
        x, y = torch.rand(2, s, s, s, 4), torch.rand(2, 4) - 0.5
        opt = None
    else:
        from hpckit.deepcam import optim
        from hpckit.deepcam.model import build_model
        from hpckit.deepcam.train import class_weights, weighted_cross_entropy
        net = build_model(cfg)
        d = cfg["data"]
        x = torch.rand(2, d["n_channels"], d["height"], d["width"])
        y = torch.randint(0, cfg["model"]["n_classes"], (2, d["height"], d["width"]))
        opt = optim.make_optimizer(net.parameters(), cfg["optimizer"])
    log = OpLog()
    with log:
        with precision.torch_autocast(prec, cpu):
            out = net(x)
        if model.startswith("cosmoflow"):
            loss = torch.mean((out.float() - y) ** 2) + net.l2_penalty()
        else:
            loss = weighted_cross_entropy(out.float(), y, class_weights(cfg))
        nodes = autograd_nodes(loss.grad_fn)
        (scaler.scale(loss) if scaler else loss).backward()
        if opt is not None:
            if scaler:
                scaler.step(opt)
                scaler.update()
            else:
                opt.step()
    return nodes, log.calls


def cuda_step(model: str, prec: str, version: str) -> tuple[list, list]:
    """The step `hpckit train --deterministic --device cuda` runs under torch `version`."""
    cfg = _cfg(model)
    chosen = determinism.choose_implementations(cfg, "pytorch", True, "cuda", version)
    return _step(model, prec, chosen.get("model.max_pool", "native"))


# ---------------------------------------------------------------- PyTorch

@pytest.mark.parametrize("version", STACK_TORCH)
@pytest.mark.parametrize("prec", precision.PRECISIONS)
@pytest.mark.parametrize("model", MODELS)
def test_no_step_runs_an_op_that_raises_on_cuda(model, prec, version):
    nodes, calls = cuda_step(model, prec, version)
    names = {type(n).__name__ for n in nodes}
    assert "ConvolutionBackward0" in names and len(nodes) > 20        # the walk sees the network
    assert determinism.raising_nodes(nodes, version) == []
    assert determinism.raising_ops(calls, version) == []
    # the only Python-defined backward is the kit's pooling, and its ops are in `calls`
    custom = {type(n).__name__ for n in nodes if isinstance(n, torch.autograd.function.BackwardCFunction)}
    assert custom <= {"_FirstMaxPool3dBackward"}
    if model.startswith("cosmoflow"):
        pooled = "_FirstMaxPool3dBackward" in names
        assert pooled == (not determinism.torch_max_pool3d_deterministic_on_cuda(version)), names


@pytest.mark.parametrize("version", STACK_TORCH)
def test_the_cosmoflow_of_cf95ba2_fails_before_torch_2_13(version):
    """cf95ba2's CosmoFlow (nn.MaxPool3d) is what failed on the H100 with 2.11."""
    nodes, calls = _step("cosmoflow-mini", "fp32", "cf95ba2")
    found, ops = determinism.raising_nodes(nodes, version), determinism.raising_ops(calls, version)
    if version.startswith("2.13"):
        assert found == [] and ops == []
    else:
        assert found and {name for name, _ in found} == {"MaxPool3DWithIndicesBackward0"}
        assert {doc for _, doc in found} == {POOL_DOC}
        assert {op for op, _ in ops} == {"max_pool3d_with_indices_backward"}


@pytest.mark.parametrize("model, max_pool", [("cosmoflow-mini", "deterministic"), ("deepcam-mini", "native")])
def test_fake_tensors_build_the_graph_real_ones_do(model, max_pool):
    import collections
    real, fake = (_step(model, "fp32", max_pool, is_fake)[0] for is_fake in (False, True))
    assert collections.Counter(type(n).__name__ for n in real) == collections.Counter(type(n).__name__ for n in fake)


def test_the_other_raising_ops_are_seen():
    """The walk flags an op whenever the docstring does, with its conditions."""
    x = torch.rand(1, 2, 6, 6, requires_grad=True)
    up = nn.functional.interpolate(x, scale_factor=2, mode="bilinear")
    pooled = nn.functional.adaptive_avg_pool2d(x, 3)       # not 1x1: a real adaptive pool, not a mean
    reduced = nn.functional.cross_entropy(x, torch.zeros(1, 6, 6, dtype=torch.long))          # mean: raises
    per_pixel = nn.functional.cross_entropy(x, torch.zeros(1, 6, 6, dtype=torch.long), reduction="none")
    flagged = {n for n, _ in determinism.raising_nodes(autograd_nodes(up.sum().grad_fn), "2.13.0")}
    assert flagged == {"UpsampleBilinear2DBackward0"}
    assert {n for n, _ in determinism.raising_nodes(autograd_nodes(pooled.sum().grad_fn), "2.13.0")} == \
        {"AdaptiveAvgPool2DBackward0"}
    assert [n for n, _ in determinism.raising_nodes(autograd_nodes(reduced.grad_fn), "2.13.0")] == \
        ["NllLoss2DBackward0"]
    assert determinism.raising_nodes(autograd_nodes(per_pixel.mean().grad_fn), "2.13.0") == []
    k = torch.rand(5, requires_grad=True).kthvalue(2).values
    assert determinism.raising_nodes(autograd_nodes(k.grad_fn), "2.9.0") and \
        determinism.raising_nodes(autograd_nodes(k.grad_fn), "2.11.0") == []


def _docstring_raising(doc: str) -> set[str]:
    part = doc.split("normally-nondeterministic operations will throw a", 1)[1].split("In addition, several", 1)[0]
    entries, cur = [], None
    for line in part.splitlines()[1:]:
        s = line.strip()
        if s.startswith("* "):
            entries.append(cur) if cur else None
            cur = s[2:]
        elif s and cur is not None:
            cur += " " + s
    return set(entries + [cur])


def test_the_table_is_the_running_torch_docstring():
    """determinism.TORCH_CUDA_RAISING for the running release is its docstring's list, entry
    for entry; a release the table has not read fails here until it is read and added."""
    major, minor, _ = determinism.torch_release()
    assert (major, minor) in determinism.TORCH_RELEASES_READ, (
        f"torch {torch.__version__}: read its torch.use_deterministic_algorithms docstring into "
        "hpckit.common.determinism (TORCH_RELEASES_READ, TORCH_CUDA_RAISING)")
    doc = torch.use_deterministic_algorithms.__doc__
    assert _docstring_raising(doc) == {e.doc for e in determinism.torch_cuda_raising()}
    deterministic_part = doc.split("will act", 1)[1].split("will throw a", 1)[0]
    assert (POOL_DOC in " ".join(deterministic_part.split())) == \
        determinism.torch_max_pool3d_deterministic_on_cuda()


def test_the_stacks_pins_are_the_releases_tested():
    from pathlib import Path
    repo = Path(__file__).resolve().parents[1]
    spack = {line.split("py-torch@", 1)[1].split()[0] for p in (repo / "site_profiles").glob("*/spack.yaml")
             for line in p.read_text().splitlines() if "py-torch@" in line}
    image = (repo / "requirements/constraints-cpu.txt").read_text().split("torch==", 1)[1].split("+")[0].split()[0]
    assert spack | {image} <= set(STACK_TORCH), (spack, image)


# ---------------------------------------------------------------- the choice, before staging

@pytest.mark.parametrize("version, device, enabled, expected", [
    ("2.9.0", "cuda", True, "deterministic"), ("2.11.0+cu130", "cuda", True, "deterministic"),
    ("2.12.1", "cuda", True, "deterministic"), ("2.13.0a0+git1234", "cuda", True, "deterministic"),
    ("2.13.0+cu128", "cuda", True, "native"), ("2.14.0", "cuda", True, "native"),
    ("2.11.0", "cuda", False, "native"), ("2.11.0", "cpu", True, "native")])
def test_auto_resolves_and_is_logged(version, device, enabled, expected):
    cfg = load_config("cosmoflow", "mini")
    assert cfg["model"]["max_pool"] == "auto"
    chosen = determinism.choose_implementations(cfg, "pytorch", enabled, device, version)
    assert chosen == {"model.max_pool": expected} and cfg["model"]["max_pool"] == expected   # hpckit_config logs cfg


def test_native_where_it_would_raise_is_refused_in_one_line():
    cfg = load_config("cosmoflow", "mini", ["model.max_pool=native"])
    with pytest.raises(KitError) as e:
        determinism.choose_implementations(cfg, "pytorch", True, "cuda", "2.11.0+cu130")
    assert "model.max_pool" in str(e.value) and "2.11.0+cu130" in str(e.value) and "\n" not in str(e.value)
    for version, device, enabled in (("2.13.0", "cuda", True), ("2.11.0", "cuda", False), ("2.11.0", "cpu", True)):
        cfg = load_config("cosmoflow", "mini", ["model.max_pool=native"])
        assert determinism.choose_implementations(cfg, "pytorch", enabled, device, version) == \
            {"model.max_pool": "native"}
    cfg = load_config("cosmoflow", "mini", ["model.max_pool=deterministic"])
    with pytest.raises(KitError, match="TensorFlow"):
        determinism.choose_implementations(cfg, "tensorflow", True, "cpu")
    assert determinism.choose_implementations(load_config("deepcam", "mini"), "pytorch", True, "cuda", "2.9.0") == {}


def test_a_refusal_comes_before_staging(tmp_path):
    """The choice is made in common/run.launch (determinism.apply): one line, exit 2, no
    log and nothing staged (shown with the refusal a CPU can reach: TensorFlow)."""
    (tmp_path / "data").mkdir()
    proc = run_hpckit("train", "cosmoflow", "--data", tmp_path / "data", "--output-dir", tmp_path / "out",
                      "--framework", "tensorflow", "--stage-dir", tmp_path / "stage",
                      "--set", "model.max_pool=deterministic", timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "model.max_pool" in lines[0], proc.stderr
    assert not (tmp_path / "out" / "mlperf.log").exists() and not (tmp_path / "stage").exists()
    proc = run_hpckit("describe", "cosmoflow", "--set", "model.max_pool=fast")
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0 and "model.max_pool" in proc.stderr


# ---------------------------------------------------------------- the kit's pooling

def _pool_pair(x: torch.Tensor):
    from hpckit.cosmoflow.model_torch import first_max_pool3d
    a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
    ya, yb = nn.functional.max_pool3d(a, 2), first_max_pool3d(b, 2)
    g = torch.randn(ya.shape, dtype=torch.float32).to(ya.dtype)
    ya.backward(g)
    yb.backward(g)
    return ya, yb, a.grad, b.grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("values", ["random", "ties", "nan"])
def test_first_max_pool3d_equals_torch(dtype, values):
    torch.manual_seed(1)
    x = torch.randn(2, 3, 8, 6, 4)
    if values == "ties":       # most windows tie (uniform regions: empty voxels of CosmoFlow's counts)
        x = torch.randint(-1, 2, x.shape).float()
        x[0, 0, :4, :4, :4] = 0.0
    if values == "nan":
        x[0, 0, 0, 0, 0] = x[0, 0, 0, 1, 1] = x[1, 2, 3, 3, 3] = float("nan")
        x[1, 1, 2:4, 2:4, 2:4] = float("-inf")
    ya, yb, ga, gb = _pool_pair(x.to(dtype))
    assert torch.equal(ya.view(torch.int16 if dtype != torch.float32 else torch.int32),
                       yb.view(torch.int16 if dtype != torch.float32 else torch.int32))     # bit-equal, NaN too
    assert torch.equal(ga.nan_to_num(), gb.nan_to_num()) and torch.equal(torch.isnan(ga), torch.isnan(gb))


def test_the_model_keeps_its_weights_and_output():
    from hpckit.cosmoflow.model_torch import CosmoFlow, MaxPool3d
    cfg = load_config("cosmoflow", "mini")
    cfg["data"]["sample_size"] = 32
    nets = {}
    for impl in ("native", "deterministic"):
        cfg["model"]["max_pool"] = impl
        torch.manual_seed(3)
        nets[impl] = CosmoFlow(cfg)
        assert all(isinstance(m, MaxPool3d) and m.impl == impl for m in nets[impl].features if isinstance(m, nn.MaxPool3d))
    a, b = nets["native"], nets["deterministic"]
    assert a.state_dict().keys() == b.state_dict().keys()
    assert all(torch.equal(a.state_dict()[k], b.state_dict()[k]) for k in a.state_dict())
    x = torch.log1p(torch.randint(0, 3, (2, 32, 32, 32, 4)).float())     # sparse counts: many ties
    la, lb = (((n(x) - 0.1) ** 2).mean() for n in (a, b))
    la.backward()
    lb.backward()
    assert torch.equal(la, lb)
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(a.parameters(), b.parameters()))
    with pytest.raises(KitError, match="model.max_pool"):
        MaxPool3d(2, "fast")


# ---------------------------------------------------------------- TensorFlow

def _tf_step_ops(cfg) -> tuple[set, bool]:
    import tensorflow as tf
    from hpckit.cosmoflow.train import TensorFlowBackend
    launched = types.SimpleNamespace(seed=5, comm=types.SimpleNamespace(kind="none"))
    backend = TensorFlowBackend(cfg, launched, None)
    s = cfg["data"]["sample_size"]
    fn = backend.train_step.get_concrete_function(tf.TensorSpec([2, s, s, s, 4], tf.float32),
                                                  tf.TensorSpec([2, 4], tf.float32))
    gd = fn.graph.as_graph_def()
    ops = {n.op for n in gd.node} | {n.op for f in gd.library.function for n in f.node_def}
    jit = bool(getattr(backend.train_step, "_jit_compile", None)) or any(
        "_XlaMustCompile" in n.attr and n.attr["_XlaMustCompile"].b for n in gd.node)
    return ops, jit


def test_tensorflow_cosmoflow_runs_no_op_that_raises_on_gpu():
    """TensorFlow's CosmoFlow step under enable_op_determinism on a GPU: its gradient ops
    (MaxPool3DGrad, Conv3DBackprop*, BiasAddGrad) have deterministic GPU kernels, the step is
    not XLA-compiled (where MaxPool3DGrad would raise), so `auto` keeps TensorFlow's own;
    the decision's controls below fail as they must."""
    cfg = load_config("cosmoflow", "mini")
    cfg["data"]["sample_size"] = 16
    cfg["model"]["n_conv_layers"] = 4
    ops, jit = _tf_step_ops(cfg)
    assert {"MaxPool3DGrad", "Conv3DBackpropFilterV2", "Conv3DBackpropInputV2", "BiasAddGrad"} <= ops
    assert not jit and determinism.tf_raising_ops(ops, jit) == []
    assert determinism.tf_raising_ops(ops, jit_compiled=True) == ["MaxPool3DGrad"]
    assert determinism.choose_implementations(cfg, "tensorflow", True, "cpu") == {"model.max_pool": "native"}


def test_tensorflow_ops_that_raise_are_seen():
    import keras
    import tensorflow as tf
    model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(), keras.layers.Dense(1)])

    @tf.function
    def step(x):      # an upsampling (nearest) between two trained layers
        with tf.GradientTape() as tape:
            h = tf.image.resize(x * model.layers[-1].kernel[0, 0], [8, 8], method="nearest")
            loss = tf.reduce_sum(model(h))
        return tape.gradient(loss, model.trainable_variables)
    gd = step.get_concrete_function(tf.TensorSpec([1, 4, 4, 1])).graph.as_graph_def()
    ops = {n.op for n in gd.node} | {n.op for f in gd.library.function for n in f.node_def}
    assert determinism.tf_raising_ops(ops, False) == ["ResizeNearestNeighborGrad"]
