"""hpckit.deepcam.optim: LAMB against the published update rule, the reference's warmup
schedules, the MLPerf keys against the official hpc_3.0.0 DeepCAM rules, bad configs."""

from __future__ import annotations

import math
from importlib import resources

import numpy as np
import pytest
import yaml

torch = pytest.importorskip("torch")

from hpckit.common.errors import KitError  # noqa: E402
from hpckit.deepcam.optim import (LAMB, lr_at, make_optimizer, make_scheduler,  # noqa: E402
                                 mlperf_optimizer_keys)

REF_OPT = {"name": "LAMB", "lr": 0.0055, "betas": [0.9, 0.999], "eps": 1e-6, "weight_decay": 0.01,
           "bias_correction": True, "grad_averaging": True, "max_grad_norm": 1.0}
REF_SCHED = {"type": "multistep", "milestones": [800], "decay_rate": 0.1, "t_max": 0,
             "eta_min": 0.0, "lr_warmup_steps": 400, "lr_warmup_factor": 1.0}
B = 0.0055


# ----------------------------------------------------------------------------- LAMB

def numpy_lamb(x0, grads, groups, max_grad_norm):
    """The paper's Algorithm 2 (plus apex's global gradient clipping), in NumPy.

    x0: initial tensors; grads[t][i]: gradient of tensor i at step t+1; groups: list of
    (indices, lr, weight_decay, beta1, beta2, eps, bias_correction, grad_averaging).
    Returns the tensors after every step and whether clipping was active at each step.
    """
    x = [a.copy() for a in x0]
    m = [np.zeros_like(a) for a in x0]
    v = [np.zeros_like(a) for a in x0]
    history, clipped = [], []
    for t, g_t in enumerate(grads, start=1):
        total = math.sqrt(sum(float(np.sum(g * g)) for g in g_t))
        active = bool(max_grad_norm) and total > max_grad_norm
        clipped.append(active)
        g_t = [g * (max_grad_norm / total) for g in g_t] if active else g_t
        for idx, lr, lam, b1, b2, eps, bias_corr, averaging in groups:
            for i in idx:
                g = g_t[i]
                m[i] = b1 * m[i] + ((1 - b1) if averaging else 1.0) * g
                v[i] = b2 * v[i] + (1 - b2) * g * g
                m_hat = m[i] / (1 - b1 ** t) if bias_corr else m[i]
                v_hat = v[i] / (1 - b2 ** t) if bias_corr else v[i]
                r = m_hat / (np.sqrt(v_hat) + eps) + lam * x[i]
                wn, rn = np.linalg.norm(x[i]), np.linalg.norm(r)
                trust = wn / rn if wn > 0 and rn > 0 else 1.0
                x[i] = x[i] - lr * trust * r
        history.append([a.copy() for a in x])
    return history, clipped


SHAPES = [(4, 3), (5,), (2, 3, 2), (6,), (3,)]  # tensor 3 starts at zero, tensor 4 stays zero

# (groups as (indices, lr, wd, beta1, beta2, eps, bias_correction, grad_averaging), max norm,
#  grad scale, whether clipping must be active)
ALL = [0, 1, 2, 3, 4]
LAMB_CASES = {
    "wd+bc+avg+clip": ([(ALL, 0.02, 0.01, 0.9, 0.999, 1e-6, True, True)], 1.0, 3.0, True),
    "plain": ([(ALL, 0.01, 0.0, 0.9, 0.999, 1e-6, False, False)], None, 1.0, False),
    "two-groups+clip": ([([0, 2], 0.01, 0.1, 0.8, 0.99, 1e-6, True, False),
                         ([1, 3, 4], 0.003, 0.0, 0.9, 0.999, 1e-3, False, True)], 0.5, 1.0, True),
    "no-clip-needed": ([(ALL, 0.05, 0.01, 0.9, 0.999, 1e-6, True, True)], 100.0, 0.1, False),
}


@pytest.mark.parametrize("case", list(LAMB_CASES))
def test_lamb_matches_paper_update_rule(case):
    groups, max_norm, scale, must_clip = LAMB_CASES[case]
    rng = np.random.default_rng(11)
    x0 = [rng.normal(size=s) for s in SHAPES]
    x0[3][:] = 0.0
    x0[4][:] = 0.0
    steps = 6
    grads = [[scale * rng.normal(size=s) for s in SHAPES] for _ in range(steps)]
    for g in grads:
        g[4][:] = 0.0
    expected, clipped = numpy_lamb(x0, grads, groups, max_norm)
    assert all(c == must_clip for c in clipped)

    params = [torch.nn.Parameter(torch.tensor(a, dtype=torch.float64)) for a in x0]
    opt = LAMB([{"params": [params[i] for i in idx], "lr": lr, "weight_decay": lam,
                 "betas": (b1, b2), "eps": eps, "bias_correction": bc, "grad_averaging": ga}
                for idx, lr, lam, b1, b2, eps, bc, ga in groups], max_grad_norm=max_norm)
    for t in range(steps):
        for p, g in zip(params, grads[t]):
            p.grad = torch.tensor(g, dtype=torch.float64)
        opt.step()
        for p, want in zip(params, expected[t]):
            np.testing.assert_allclose(p.detach().numpy(), want, rtol=1e-10, atol=1e-15)
    assert np.any(params[3].detach().numpy() != 0.0)  # the zero tensor moved (trust ratio 1)
    assert np.all(params[4].detach().numpy() == 0.0)  # zero weight, zero update


def test_lamb_decreases_least_squares_loss():
    gen = torch.Generator().manual_seed(3)
    a = torch.randn(64, 10, generator=gen)
    b = a @ torch.randn(10, generator=gen) + 0.01 * torch.randn(64, generator=gen)
    x = torch.nn.Parameter(0.1 * torch.randn(10, generator=gen))
    opt = make_optimizer([x], {**REF_OPT, "lr": 0.05})

    def loss():
        return ((a @ x - b) ** 2).mean()

    first = loss().item()
    for _ in range(150):
        opt.zero_grad()
        loss().backward()
        opt.step()
    assert loss().item() < 0.01 * first


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_lamb_cuda_matches_cpu():
    gen = torch.Generator().manual_seed(5)
    x0 = [torch.randn(s, generator=gen) for s in [(64, 32), (32,)]]
    grads = [[torch.randn_like(a) for a in x0] for _ in range(4)]
    result = {}
    for dev in ("cpu", "cuda"):
        ps = [torch.nn.Parameter(a.to(dev)) for a in x0]
        opt = make_optimizer(ps, REF_OPT)
        for g_t in grads:
            for p, g in zip(ps, g_t):
                p.grad = g.to(dev)
            opt.step()
        result[dev] = [p.detach().cpu() for p in ps]
    for c, g in zip(result["cpu"], result["cuda"]):
        torch.testing.assert_close(c, g, rtol=1e-5, atol=1e-6)


class PerParameterLAMB(torch.optim.Optimizer):
    """The kit's LAMB as it was up to cf95ba2: the same math, one tensor at a time (a
    Python loop of ~20 ops per tensor). The multi-tensor LAMB must stay equal to it."""

    def __init__(self, params, lr, betas, eps, weight_decay, bias_correction=True, grad_averaging=True,
                 max_grad_norm=1.0):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                      bias_correction=bias_correction, grad_averaging=grad_averaging,
                                      max_grad_norm=max_grad_norm))

    @torch.no_grad()
    def step(self):
        grads = [p.grad for group in self.param_groups for p in group["params"] if p.grad is not None]
        max_norm = self.defaults["max_grad_norm"]
        divisor = None
        if max_norm:
            norms = [torch.linalg.vector_norm(g, dtype=torch.float32) for g in grads]
            divisor = torch.clamp(torch.linalg.vector_norm(torch.stack(norms)) / max_norm, min=1.0)
        for group in self.param_groups:
            lr, eps, wd = group["lr"], group["eps"], group["weight_decay"]
            beta1, beta2 = group["betas"]
            c = (1.0 - beta1) if group["grad_averaging"] else 1.0
            for p in group["params"]:
                g = p.grad if divisor is None else p.grad / divisor
                state = self.state[p]
                if not state:
                    state.update(step=0, m=torch.zeros_like(p), v=torch.zeros_like(p))
                state["step"] += 1
                t, m, v = state["step"], state["m"], state["v"]
                m.mul_(beta1).add_(g, alpha=c)
                v.mul_(beta2).addcmul_(g, g, value=1.0 - beta2)
                m_hat, v_hat = (m / (1.0 - beta1 ** t), v / (1.0 - beta2 ** t)) if group["bias_correction"] else (m, v)
                update = m_hat / (v_hat.sqrt().add_(eps))
                if wd != 0.0:
                    update.add_(p, alpha=wd)
                w_norm, u_norm = torch.linalg.vector_norm(p), torch.linalg.vector_norm(update)
                ratio = torch.where((w_norm > 0) & (u_norm > 0), w_norm / u_norm, torch.ones_like(w_norm))
                p.add_(update.mul_(ratio), alpha=-lr)


def _mini_deepcam(seed: int):
    from hpckit.common.config import load_config
    from hpckit.deepcam.model import build_model
    cfg = load_config("deepcam", "mini")
    torch.manual_seed(seed)
    return cfg, build_model(cfg)


def test_multi_tensor_lamb_equals_per_parameter_lamb_on_deepcam():
    """10 steps on the mini DeepCAM network's tensors (every kind: convolutions, batch norm,
    the zero-initialised biases and affine shifts) with the reference's LAMB settings and a
    rising learning rate, both optimizers fed the same gradients (the network's, at the
    multi-tensor side's weights): the weights stay within 1e-6 of each other."""
    cfg, model = _mini_deepcam(3)
    twin = [torch.nn.Parameter(p.detach().clone()) for p in model.parameters()]
    ours = make_optimizer(model.parameters(), REF_OPT)
    theirs = PerParameterLAMB(twin, REF_OPT["lr"], tuple(REF_OPT["betas"]), REF_OPT["eps"], REF_OPT["weight_decay"])
    start = [p.detach().clone() for p in model.parameters()]
    gen = torch.Generator().manual_seed(4)
    d = cfg["data"]
    for step in range(10):
        x = torch.randn(1, d["n_channels"], 32, 48, generator=gen)   # any multiple of 16: the same tensors
        model.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        for p, q in zip(model.parameters(), twin):
            q.grad = p.grad.clone()
        for opt in (ours, theirs):
            for group in opt.param_groups:
                group["lr"] = REF_OPT["lr"] * (step + 1) / 10
            opt.step()
        torch.testing.assert_close(torch.cat([a.detach().flatten() for a in model.parameters()]),
                                   torch.cat([b.detach().flatten() for b in twin]), rtol=1e-6, atol=1e-6)
    assert all((a.detach() != a0).any() for a, a0 in zip(model.parameters(), start))


def _top_level_aten_ops(fn) -> int:
    """ATen ops that `fn` dispatches itself (not those an op runs inside: on the CPU a
    foreach op runs one op per tensor inside)."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()

    def inside_aten(event):
        parent = event.cpu_parent
        while parent is not None:
            if parent.name.startswith("aten::"):
                return True
            parent = parent.cpu_parent
        return False

    return sum(1 for e in prof.events() if e.name.startswith("aten::") and not inside_aten(e))


@pytest.mark.parametrize("found_inf", [False, True])
def test_lamb_step_dispatches_a_number_of_ops_independent_of_the_parameter_count(found_inf):
    counts = {}
    for n in (4, 64):
        params = [torch.nn.Parameter(torch.randn(3, 5)) for _ in range(n)]
        for p in params:
            p.grad = torch.randn_like(p)
        opt = make_optimizer(params, REF_OPT)
        opt.step()                      # the state exists from here on
        kwargs = {"found_inf": torch.tensor(1.0 if found_inf else 0.0)}
        counts[n] = _top_level_aten_ops(lambda: opt.step(**kwargs))
    assert counts[4] == counts[64], counts
    assert counts[64] < 64, counts      # the per-parameter loop dispatched ~20 per tensor


def test_lamb_skips_a_step_with_found_inf_on_the_device():
    """found_inf (GradScaler's contract, and the kit's non-finite guard) leaves weights,
    moments and the step count exactly as they were, the first step included (a zero count
    must not divide a zero moment by 1 - beta^0 = 0)."""
    gen = torch.Generator().manual_seed(8)
    params = [torch.nn.Parameter(torch.randn(4, 3, generator=gen)), torch.nn.Parameter(torch.zeros(3))]
    opt = make_optimizer(params, REF_OPT)
    for p in params:
        p.grad = torch.zeros_like(p)    # the kit zeroes non-finite gradients before a skipped step
    before = [p.detach().clone() for p in params]
    opt.step(found_inf=torch.tensor(1.0))
    assert all(torch.equal(p, b) for p, b in zip(params, before))
    assert float(opt.state[params[0]]["step"]) == 0
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen)
    opt.step(found_inf=torch.tensor(0.0))
    state = [(opt.state[p]["exp_avg"].clone(), opt.state[p]["exp_avg_sq"].clone()) for p in params]
    after_one = [p.detach().clone() for p in params]
    assert not torch.equal(after_one[0], before[0]) and not torch.equal(after_one[1], before[1])
    for p in params:
        p.grad = torch.zeros_like(p)
    opt.step(found_inf=torch.tensor(1.0))
    assert all(torch.equal(p, b) for p, b in zip(params, after_one))
    assert all(torch.equal(opt.state[p]["exp_avg"], m) and torch.equal(opt.state[p]["exp_avg_sq"], v)
               for p, (m, v) in zip(params, state))
    assert float(opt.state[params[0]]["step"]) == 1


def test_lamb_under_grad_scaler_skips_overflow_and_backs_off():
    """fp16's dynamic loss scaling (torch.amp.GradScaler) hands LAMB its found_inf: an
    overflowing step changes nothing but the scale, which halves; a finite one trains."""
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 16)
    w = torch.nn.Parameter(torch.ones(3))
    opt = make_optimizer([w], REF_OPT)
    for value, moved in ((float("inf"), False), (1.0, True)):
        opt.zero_grad(set_to_none=True)
        scaler.scale((w * value).sum()).backward()
        scaler.unscale_(opt)
        found = sum(v for v in scaler._found_inf_per_device(opt).values())
        if float(found):
            w.grad.zero_()
        before, scale = w.detach().clone(), scaler.get_scale()
        scaler.step(opt)
        scaler.update()
        assert (not torch.equal(w.detach(), before)) == moved
        assert scaler.get_scale() == (scale if moved else scale / 2)


def test_make_optimizer_kinds():
    p = [torch.nn.Parameter(torch.zeros(2))]
    adam = make_optimizer(p, {**REF_OPT, "name": "Adam"})
    adamw = make_optimizer(p, {**REF_OPT, "name": "AdamW"})
    lamb = make_optimizer(p, REF_OPT)
    assert type(adam) is torch.optim.Adam and type(adamw) is torch.optim.AdamW
    assert isinstance(lamb, LAMB)
    for opt in (adam, adamw, lamb):
        g = opt.param_groups[0]
        got = (g["lr"], tuple(g["betas"]), g["eps"], g["weight_decay"])
        assert got == (0.0055, (0.9, 0.999), 1e-6, 0.01)
    assert lamb.defaults["max_grad_norm"] == 1.0
    assert lamb.param_groups[0]["bias_correction"] and lamb.param_groups[0]["grad_averaging"]


# ----------------------------------------------------------------------------- schedules

def _ms(milestones, rate, steps, factor=1.0):
    return {"type": "multistep", "milestones": milestones, "decay_rate": rate,
            "lr_warmup_steps": steps, "lr_warmup_factor": factor}


def _cos(t_max, eta_min, steps, factor=1.0):
    return {"type": "cosine_annealing", "t_max": t_max, "eta_min": eta_min,
            "lr_warmup_steps": steps, "lr_warmup_factor": factor}


P = 0.0055 * 399 / 400  # the reference's plateau: its warmup ends one index early
HAND = [
    # the reference run: LAMB, lr 0.0055, 400 warmup steps (factor 1), milestone 800, rate 0.1
    (REF_SCHED, 0, 0.0055 / 400),
    (REF_SCHED, 199, 0.00275),
    (REF_SCHED, 398, P),
    (REF_SCHED, 399, P),
    (REF_SCHED, 1199, P),
    (REF_SCHED, 1200, 0.1 * P),
    (REF_SCHED, 10_000, 0.1 * P),
    # warmup factor 2: from 1.25 B to 1.75 B, then milestones 3 and 5 after warmup
    (_ms([3, 5], 0.5, 4, 2.0), 0, 1.25 * B),
    (_ms([3, 5], 0.5, 4, 2.0), 2, 1.75 * B),
    (_ms([3, 5], 0.5, 4, 2.0), 6, 1.75 * B),
    (_ms([3, 5], 0.5, 4, 2.0), 7, 0.875 * B),
    (_ms([3, 5], 0.5, 4, 2.0), 8, 0.875 * B),
    (_ms([3, 5], 0.5, 4, 2.0), 9, 0.4375 * B),
    # no warmup: the reference's plain MultiStepLR, first step at index 1
    (_ms([0, 3], 0.1, 0), 0, B),
    (_ms([0, 3], 0.1, 0), 1, B),
    (_ms([0, 3], 0.1, 0), 2, 0.1 * B),
    (_ms([0, 3], 0.1, 1, 3.0), 0, B),  # one warmup step: no ramp at all
    (_ms([0, 3], 0.1, 1, 3.0), 1, 0.1 * B),
    (_ms([0, 3], 0.1, 1, 3.0), 4, 0.01 * B),
    # cosine after warmup: starts at the plateau, restarts with the base learning rate
    (_cos(1000, 1e-4, 400), 0, 0.0055 / 400),
    (_cos(1000, 1e-4, 400), 399, P),
    (_cos(1000, 1e-4, 400), 899, 1e-4 + (P - 1e-4) / 2),
    (_cos(1000, 1e-4, 400), 1399, 1e-4),
    (_cos(1000, 1e-4, 400), 1400, 1e-4 + (B - 1e-4) * math.sin(math.pi * 0.0005) ** 2),
    # cosine without warmup: the first step runs at index 0
    (_cos(100, 0.0, 0), 0, B),
    (_cos(100, 0.0, 0), 50, B / 2),
    (_cos(100, 0.0, 0), 100, 0.0),
    (_cos(100, 0.0, 0), 150, B / 2),
]


@pytest.mark.parametrize("cfg,step,want", HAND)
def test_lr_at_hand_values(cfg, step, want):
    assert lr_at(step, B, cfg) == pytest.approx(want, rel=1e-12, abs=1e-18)


def reference_chain(cfg, base, n):
    """The reference's stateful schedulers, re-stated: each value derives from the last.

    The reference creates them with last_epoch=0 (first optimizer step at index 1), except a
    cosine schedule without warmup (plain torch CosineAnnealingLR: index 0)."""
    W, f = cfg["lr_warmup_steps"], cfg["lr_warmup_factor"]
    cosine = cfg["type"] == "cosine_annealing"
    lr, s, out = base, (0 if cosine and W == 0 else 1), []
    for _ in range(n):
        if W > 0 and s < W:
            lr = base * s / W if f == 1.0 else base * ((f - 1.0) * s / W + 1.0)
        elif not cosine:
            shift = W + 1 if W > 0 else 0
            lr *= cfg["decay_rate"] ** sum(1 for m in cfg["milestones"] if m + shift == s)
        else:
            T, eta, e = cfg["t_max"], cfg["eta_min"], s - W
            if e == 0:
                lr = lr if W > 0 else base
            elif (e - 1 - T) % (2 * T) == 0:
                lr += (base - eta) * (1 - math.cos(math.pi / T)) / 2
            else:
                ratio = (1 + math.cos(math.pi * e / T)) / (1 + math.cos(math.pi * (e - 1) / T))
                lr = ratio * (lr - eta) + eta
        out.append(lr)
        s += 1
    return out


CHAIN_CFGS = ([_ms(ms, 0.3, w, f) for w in (0, 1, 2, 5) for f in (1.0, 2.5)
               for ms in ([], [0], [2, 6, 6])]
              + [_cos(t, eta, w, f) for w in (0, 1, 3) for f in (1.0, 2.0)
                 for t, eta in ((1, 0.0), (4, 1e-3))])


def test_lr_at_equals_reference_recursion():
    for cfg in CHAIN_CFGS:
        want = reference_chain(cfg, B, 30)
        got = [lr_at(k, B, cfg) for k in range(30)]
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-18, err_msg=str(cfg))


def test_scheduler_follows_lr_at_and_resumes():
    p = torch.nn.Parameter(torch.zeros(1))
    q = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([{"params": [p], "lr": B}, {"params": [q], "lr": 2 * B}])
    sched = make_scheduler(opt, REF_SCHED)
    for k in range(1300):
        assert sched.last_epoch == k
        assert opt.param_groups[0]["lr"] == lr_at(k, B, REF_SCHED)
        assert opt.param_groups[1]["lr"] == lr_at(k, 2 * B, REF_SCHED)
        opt.step()
        sched.step()
    resumed_opt = torch.optim.SGD([p], lr=B)
    resumed = make_scheduler(resumed_opt, REF_SCHED, start_step=1200)
    assert resumed.last_epoch == 1200
    assert resumed_opt.param_groups[0]["lr"] == pytest.approx(0.1 * P, rel=1e-12)


# ----------------------------------------------------------------------------- MLPerf keys

def _rules(name):
    path = resources.files("mlperf_logging") / "compliance_checker" / "hpc_3.0.0" / name
    return {r["KEY"]["NAME"]: r["KEY"] for r in yaml.safe_load(path.read_text()) if "KEY" in r}


def _required(opt_name, sched_type):
    files = ["closed_deepcam.yaml", f"closed_deepcam_{sched_type}.yaml"]
    if opt_name == "LAMB":
        files.append("closed_deepcam_lamb.yaml")
    rules = {}
    for f in files:
        rules.update({k: r for k, r in _rules(f).items()
                      if k.startswith(("opt_", "scheduler_")) and r.get("REQ") == "EXACTLY_ONE"})
    return rules


def _check_fails(rule, value):
    checks = rule.get("CHECK", [])
    checks = [checks] if isinstance(checks, str) else checks
    return [c for c in checks if not eval(c, {"math": math}, {"v": {"value": value}})]


@pytest.mark.parametrize("opt,sched", [
    (REF_OPT, REF_SCHED),
    ({**REF_OPT, "name": "Adam"}, _cos(5000, 1e-5, 100, 1.5)),
    ({**REF_OPT, "name": "AdamW", "weight_decay": 0.0}, _ms([], 1.0, 0)),
    ({**REF_OPT, "max_grad_norm": 1}, _cos(1, 0, 0)),
])
def test_mlperf_keys_satisfy_closed_deepcam_rules(opt, sched):
    pairs = mlperf_optimizer_keys(opt, sched)
    names = [k for k, _ in pairs]
    assert len(names) == len(set(names))
    rules = _required(opt["name"], sched["type"])
    assert len(rules) >= 7
    assert set(names) == set(rules) | {"opt_weight_decay"}
    for key, value in pairs:
        if key in rules:
            assert not _check_fails(rules[key], value), (key, value)


def test_mlperf_keys_reference_order_and_failing_checks():
    pairs = mlperf_optimizer_keys(REF_OPT, REF_SCHED)
    assert pairs == [
        ("opt_name", "LAMB"), ("opt_lr", 0.0055), ("opt_bias_correction", True),
        ("opt_betas", [0.9, 0.999]), ("opt_eps", 1e-6), ("opt_weight_decay", 0.01),
        ("opt_grad_averaging", True), ("opt_max_grad_norm", 1.0),
        ("scheduler_type", "multistep"), ("scheduler_milestones", [800]),
        ("scheduler_decay_rate", 0.1), ("scheduler_lr_warmup_steps", 400),
        ("scheduler_lr_warmup_factor", 1.0)]
    # values the kit accepts but the closed division does not are caught by the rules
    rules = _required("LAMB", "multistep")
    open_div = dict(mlperf_optimizer_keys({**REF_OPT, "eps": 1e-8, "max_grad_norm": None,
                                           "grad_averaging": False}, REF_SCHED))
    failing = {k for k in rules if _check_fails(rules[k], open_div[k])}
    assert failing == {"opt_eps", "opt_max_grad_norm", "opt_grad_averaging"}


# ----------------------------------------------------------------------------- bad configs

BAD = [
    ("opt", "name", "SGD", "optimizer.name"),
    ("opt", "name", "lamb", "optimizer.name"),
    ("opt", "lr", 0.0, "optimizer.lr"),
    ("opt", "lr", "0.1", "optimizer.lr"),
    ("opt", "betas", [0.9], "optimizer.betas"),
    ("opt", "betas", [0.9, 1.0], "optimizer.betas"),
    ("opt", "eps", 0, "optimizer.eps"),
    ("opt", "weight_decay", -0.1, "optimizer.weight_decay"),
    ("opt", "bias_correction", 1, "optimizer.bias_correction"),
    ("opt", "grad_averaging", "yes", "optimizer.grad_averaging"),
    ("opt", "max_grad_norm", -1.0, "optimizer.max_grad_norm"),
    ("opt", "momentum", 0.9, "optimizer.momentum"),
    ("opt", "lr", None, "optimizer.lr"),
    ("sched", "type", "step", "scheduler.type"),
    ("sched", "milestones", "800", "scheduler.milestones"),
    ("sched", "milestones", [-1], "scheduler.milestones"),
    ("sched", "milestones", [800.0], "scheduler.milestones"),
    ("sched", "decay_rate", 1.5, "scheduler.decay_rate"),
    ("sched", "decay_rate", 0.0, "scheduler.decay_rate"),
    ("sched", "lr_warmup_steps", -1, "scheduler.lr_warmup_steps"),
    ("sched", "lr_warmup_steps", 1.5, "scheduler.lr_warmup_steps"),
    ("sched", "lr_warmup_factor", 0.5, "scheduler.lr_warmup_factor"),
    ("sched", "gamma", 0.1, "scheduler.gamma"),
    ("cos", "t_max", 0, "scheduler.t_max"),
    ("cos", "eta_min", -1e-3, "scheduler.eta_min"),
]


@pytest.mark.parametrize("section,key,value,named", BAD)
def test_bad_config_names_the_key(section, key, value, named):
    opt, sched = dict(REF_OPT), dict(REF_SCHED)
    if section == "cos":
        sched = _cos(1000, 0.0, 10)
    target = opt if section == "opt" else sched
    if value is None:
        del target[key]
    else:
        target[key] = value
    with pytest.raises(KitError, match=f"'{named}'"):
        mlperf_optimizer_keys(opt, sched)
    if section == "opt":
        with pytest.raises(KitError, match=f"'{named}'"):
            make_optimizer([torch.nn.Parameter(torch.zeros(1))], opt)
    else:
        with pytest.raises(KitError, match=f"'{named}'"):
            lr_at(0, B, sched)
        with pytest.raises(KitError, match=f"'{named}'"):
            make_scheduler(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=B), sched)
