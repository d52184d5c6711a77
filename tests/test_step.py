"""hpckit.common.step, the training step both PyTorch back ends share (issue 32), on the CPU:
gradients in one buffer, no read-back to the host inside an epoch, the non-finite guard
that skips on the device and names the first bad step, fp16 loss scaling, and the
resolution of train.memory_format / train.cuda_graph. The CUDA graph itself runs on a GPU
only (bench/gpu_check.py); its refusals and choices are tested here."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from hpckit.common import step  # noqa: E402
from hpckit.common.config import load_config  # noqa: E402
from hpckit.common.errors import KitError  # noqa: E402
from hpckit.common.run import Diverged  # noqa: E402
from hpckit.deepcam.optim import make_optimizer  # noqa: E402

LAMB_CFG = {"name": "LAMB", "lr": 0.01, "betas": [0.9, 0.999], "eps": 1e-6, "weight_decay": 0.01}


def _net(seed=0, channels_last=False):
    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
                              torch.nn.Conv2d(4, 2, 1))
    return net.to(memory_format=torch.channels_last) if channels_last else net


def _trainstep(net, precision_name="fp32", opt=None):
    opt = opt or make_optimizer(net.parameters(), LAMB_CFG)

    def forward(x, y):
        with ts.autocast():
            out = net(x)
        return (out.float() - y).square().mean(), out

    ts = step.TrainStep(params=list(net.parameters()), optimizer=opt, forward=forward, device=torch.device("cpu"),
                        precision_name=precision_name)
    return ts


def _batch(gen, bad=None):
    x = torch.randn(2, 3, 8, 8, generator=gen)
    if bad is not None:
        x[0, 0, 0, 0] = bad
    return x, torch.randn(2, 2, 8, 8, generator=gen)


@pytest.mark.parametrize("channels_last", [False, True])
def test_gradients_are_views_of_one_buffer_in_the_parameters_layout(channels_last):
    net = _net(channels_last=channels_last)
    ts = _trainstep(net)
    gen = torch.Generator().manual_seed(1)
    for p in net.parameters():
        assert p.grad.stride() == p.stride()
    before = [p.detach().clone() for p in net.parameters()]
    for _ in range(3):
        ts.step(*_batch(gen))
    assert ts.flat.intact() and float(ts.flat.buffer.abs().sum()) == 0.0   # zeroed after each step
    assert all(not torch.equal(p, b) for p, b in zip(net.parameters(), before))


def test_flat_gradients_equal_autograd_own():
    """The same step with the kit's buffer and with autograd's own .grad tensors."""
    gen = torch.Generator().manual_seed(2)
    x, y = _batch(gen)
    a, b = _net(3), _net(3)
    ts = _trainstep(a)
    (a(x) - y).square().mean().backward()
    (b(x) - y).square().mean().backward()
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.equal(p.grad, q.grad)
    assert ts.flat.intact()


class _HostReads:
    """Counts the Tensor methods that read a value back to the host."""
    NAMES = ("item", "__float__", "__int__", "__bool__", "tolist", "numpy", "__index__")

    def __init__(self, monkeypatch):
        self.count = 0
        for name in self.NAMES:
            original = getattr(torch.Tensor, name)

            def counted(t, *a, _original=original, **k):
                self.count += 1
                return _original(t, *a, **k)
            monkeypatch.setattr(torch.Tensor, name, counted)


@pytest.mark.parametrize("precision_name", ["fp32", "fp16"])
def test_no_host_read_inside_an_epoch(monkeypatch, precision_name):
    """Between two reads of the guard (every CHECK_EVERY steps), a step reads nothing back
    to the host: 2 steps and CHECK_EVERY - 1 steps read the same (zero) number of values."""
    net = _net()
    ts = _trainstep(net, precision_name)
    gen = torch.Generator().manual_seed(4)
    batches = [_batch(gen) for _ in range(step.CHECK_EVERY - 1)]
    ts.step(*batches[0])                   # lazy state (optimizer moments, GradScaler's scale)
    reads = _HostReads(monkeypatch)
    for x, y in batches[1:]:
        ts.step(x, y)
    assert reads.count == 0
    ts.step(*batches[0])                   # the CHECK_EVERY-th step reads the guard
    assert reads.count > 0


def test_a_nan_gradient_is_skipped_on_the_device_and_ends_the_run_naming_its_step():
    """A NaN in the 3rd batch: that update and every later one are skipped on the device
    (the weights stay those after step 2, while finite batches keep coming), and the next
    read of the guard raises Diverged naming step 3."""
    net = _net()
    ts = _trainstep(net)
    gen = torch.Generator().manual_seed(5)
    ts.step(*_batch(gen))
    ts.step(*_batch(gen))
    after_two = [p.detach().clone() for p in net.parameters()]
    ts.step(*_batch(gen, bad=float("nan")))
    ts.step(*_batch(gen))
    ts.step(*_batch(gen))
    assert all(torch.equal(p, a) for p, a in zip(net.parameters(), after_two))
    with pytest.raises(Diverged, match=r"the gradient norm is nan at training step 3: the training diverged"):
        ts.check()


def test_every_step_is_checked_at_the_latest_after_check_every_steps():
    net = _net()
    ts = _trainstep(net)
    gen = torch.Generator().manual_seed(6)
    ts.step(*_batch(gen, bad=float("inf")))
    with pytest.raises(Diverged, match="at training step 1"):
        for _ in range(step.CHECK_EVERY):
            ts.step(*_batch(gen))
    assert ts.updates == step.CHECK_EVERY


def test_fp16_skips_an_overflow_halves_the_scale_and_trains_on():
    """fp16 (emulated on this CPU, fine for the logic): an overflowing step is skipped, the
    loss scale halves, the next finite step trains; only FP16_PATIENCE overflows in a row
    end the run, naming where they began."""
    net = _net()
    ts = _trainstep(net, "fp16")
    gen = torch.Generator().manual_seed(7)
    ts.step(*_batch(gen))
    scale = ts.scaler.get_scale()
    before = [p.detach().clone() for p in net.parameters()]
    ts.step(*_batch(gen, bad=float("inf")))
    assert all(torch.equal(p, b) for p, b in zip(net.parameters(), before))
    assert ts.scaler.get_scale() == scale / 2
    ts.check()                                   # one overflow does not end an fp16 run
    ts.step(*_batch(gen))
    assert any(not torch.equal(p, b) for p, b in zip(net.parameters(), before))
    for _ in range(step.FP16_PATIENCE):
        ts.step(*_batch(gen, bad=float("nan")))
    with pytest.raises(Diverged, match=rf"not finite in {step.FP16_PATIENCE} consecutive training steps up to "
                                       rf"step {3 + step.FP16_PATIENCE}.*first at step 2"):
        ts.check()
    assert ts.guard.skipped_steps() == 1 + step.FP16_PATIENCE + 0


def test_fp16_loss_scaling_trains_like_fp32():
    """The same 150 steps on a least-squares problem in fp16 (loss-scaled) and fp32 both
    train (the scaling is undone before the update: a scaled step would diverge)."""
    results = {}
    for name in ("fp32", "fp16"):
        torch.manual_seed(0)
        lin = torch.nn.Linear(8, 1)
        opt = make_optimizer(lin.parameters(), {**LAMB_CFG, "lr": 0.05})
        gen = torch.Generator().manual_seed(1)
        a = torch.randn(64, 8, generator=gen)
        b = a @ torch.randn(8, 1, generator=gen)

        def forward(x, y, lin=lin):
            with ts.autocast():
                out = lin(x)
            return (out.float() - y).square().mean(), None
        ts = step.TrainStep(params=list(lin.parameters()), optimizer=opt, forward=forward,
                            device=torch.device("cpu"), precision_name=name)
        for _ in range(150):
            ts.step(a, b)
        results[name] = float((lin(a) - b).square().mean().detach())
    start = float(b.square().mean())     # the loss of the zero model; the initial one is about that
    # fp16's products round to 11 bits: its floor is above fp32's, both far below the start
    assert results["fp32"] < 0.01 * start and results["fp16"] < 0.01 * start, (start, results)


@pytest.mark.parametrize("bench", ["deepcam", "cosmoflow"])
def test_options_resolve_on_the_cpu(bench):
    cfg = load_config(bench, "mini")
    opt = cfg["optimizer"]["name"]
    step.resolve_options(cfg, torch.device("cpu"), True, opt)
    assert cfg["train"]["memory_format"] == "contiguous" and cfg["train"]["cuda_graph"] is False
    for key, value, why in (("cuda_graph", "true", "needs --device cuda"),
                            ("memory_format", "nchw", "is not one of auto, channels_last, contiguous"),
                            ("cuda_graph", "maybe", "is not one of auto, true, false")):
        cfg = load_config(bench, "mini", [f"train.{key}={value}"])
        with pytest.raises(KitError, match=f"config key 'train.{key}': .*{why}"):
            step.resolve_options(cfg, torch.device("cpu"), True, opt)


class _Cuda:
    type = "cuda"


@pytest.mark.parametrize("single,accumulate,optimizer,why", [
    (False, 1, "LAMB", "single-process runs only"),
    (True, 2, "LAMB", "gradient_accumulation_frequency 1"),
    (True, 1, "AdamW", "optimizer AdamW reads its learning rate on the host")])
def test_cuda_graph_refusals_and_auto(single, accumulate, optimizer, why):
    """What the capture cannot hold is refused in one line when asked for, and left out by
    auto; channels_last is the CUDA default."""
    cfg = load_config("deepcam", "mini", [f"train.gradient_accumulation_frequency={accumulate}"])
    step.resolve_options(cfg, _Cuda(), single, optimizer)
    assert cfg["train"]["cuda_graph"] is False and cfg["train"]["memory_format"] == "channels_last"
    cfg = load_config("deepcam", "mini", [f"train.gradient_accumulation_frequency={accumulate}",
                                          "train.cuda_graph=true"])
    with pytest.raises(KitError, match=why):
        step.resolve_options(cfg, _Cuda(), single, optimizer)
    cfg = load_config("deepcam", "mini")
    step.resolve_options(cfg, _Cuda(), True, "LAMB")
    assert cfg["train"]["cuda_graph"] is True


def test_keras_sgd_is_keras_momentum_and_skips_on_the_device():
    """CosmoFlow's optimizer: v = m v - lr g, w += v (Keras SGD, the reference's), as the
    three foreach ops the kit ran before issue 32; found_inf leaves v and w as they were."""
    from hpckit.cosmoflow.optim_torch import KerasSGD
    gen = torch.Generator().manual_seed(9)
    params = [torch.nn.Parameter(torch.randn(4, 3, generator=gen)), torch.nn.Parameter(torch.randn(5, generator=gen))]
    w = [p.detach().clone() for p in params]
    v = [torch.zeros_like(p) for p in params]
    opt = KerasSGD(params, lr=0.1, momentum=0.9)
    for lr in (0.1, 0.05, 0.05):
        grads = [torch.randn(p.shape, generator=gen) for p in params]
        for p, g in zip(params, grads):
            p.grad = g.clone()
        for group in opt.param_groups:
            group["lr"] = lr
        opt.step()
        torch._foreach_mul_(v, 0.9)
        torch._foreach_add_(v, grads, alpha=-lr)
        torch._foreach_add_(w, v)
        for p, want in zip(params, w):
            torch.testing.assert_close(p.detach(), want, rtol=1e-6, atol=1e-7)
    before = [p.detach().clone() for p in params]
    velocity = [opt.state[p]["velocity"].clone() for p in params]
    for p in params:
        p.grad = torch.zeros_like(p)
    opt.step(found_inf=torch.tensor(1.0))
    assert all(torch.equal(p, b) for p, b in zip(params, before))
    assert all(torch.equal(opt.state[p]["velocity"], u) for p, u in zip(params, velocity))
