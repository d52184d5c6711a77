"""Optimizers and learning-rate schedules for DeepCAM (MLPerf HPC closed division).

The closed division allows Adam, AdamW and LAMB (eps 1e-6) with a `multistep` or a
`cosine_annealing` schedule, each behind an optional linear warmup. This module builds them
from two config sections and names the MLPerf log keys that describe them.

Config shapes (the `optimizer:` and `scheduler:` sections of a benchmark config)::

    cfg_opt = {
        "name": "LAMB",            # Adam | AdamW | LAMB (case as the MLPerf rules spell it)
        "lr": 0.0055,              # base learning rate (> 0)
        "betas": [0.9, 0.999],     # two values in [0, 1)
        "eps": 1e-6,               # > 0 (the closed rules want 1e-6)
        "weight_decay": 0.01,      # >= 0; Adam: L2 added to the gradient, AdamW/LAMB: decoupled
        "bias_correction": True,   # LAMB only (optional, default True)
        "grad_averaging": True,    # LAMB only (optional, default True)
        "max_grad_norm": 1.0,      # LAMB only (optional, default 1.0); 0 or None: no clipping
    }
    cfg_sched = {
        "type": "multistep",       # multistep | cosine_annealing
        "milestones": [800],       # multistep: steps (see below), integers >= 0
        "decay_rate": 0.1,         # multistep: factor per milestone, 0 < rate <= 1
        "t_max": 0,                # cosine_annealing: half period in steps, >= 1
        "eta_min": 0.0,            # cosine_annealing: lowest learning rate, >= 0 (optional)
        "lr_warmup_steps": 400,    # >= 0 (optional, default 0: no warmup)
        "lr_warmup_factor": 1.0,   # >= 1 (optional, default 1.0)
    }

Keys that the chosen optimizer or schedule does not use are ignored (a multistep config may
carry `t_max: 0`); unknown keys are reported. Bad values raise `KitError` naming the key
(`optimizer.<key>`, `scheduler.<key>`).

Learning-rate schedule: what the reference does
------------------------------------------------
The DeepCAM reference (mlcommons/hpc, deepcam/src/deepCam: utils/optimizer_helpers.py,
utils/schedulers.py, train.py, driver/trainer.py) builds its scheduler with
`last_epoch = start_step = 0` and calls `scheduler.step()` after every optimizer step. A torch
scheduler constructed with `last_epoch=0` advances once on construction, so the optimizer step
number k (0-based: k optimizer steps were taken before it) runs at the reference scheduler's
index s = k + 1. The one exception is cosine annealing without warmup, where the reference
builds a plain `CosineAnnealingLR` without `last_epoch` and so s = k. The reference
schedulers are "chainable" (each value is derived from the previous one); `lr_at` is their
closed form in k. With base learning rate B, W = lr_warmup_steps, f = lr_warmup_factor:

* warmup value at index s: w(s) = B * s / W when f == 1 (a ramp up from 0), otherwise
  w(s) = B * (1 + (f - 1) * s / W) (a ramp from B towards f * B). This is the multiplier
  convention of the GradualWarmupScheduler that the reference first used.
* W >= 1: for k + 1 < W the step runs at w(k + 1). The warmup phase of the reference ends at
  index s = W - 1: from s = W on it keeps the previous value, so the plateau after warmup is
  P = w(W - 1) (for f == 1 that is B * (W - 1) / W, not B; P = B when W == 1).
  - multistep: lr = P * decay_rate ** n, n = number of milestones m with m + W <= k, i.e. a
    milestone counts in optimizer steps from the end of warmup (the reference shifts its
    milestones by W + 1 scheduler indices). The reference run (W = 400, milestone 800) runs
    steps 0..398 in warmup, 399..1199 at P, and from step 1200 on at 0.1 * P.
  - cosine_annealing: e = k + 1 - W, lr = eta_min + (A - eta_min) * (1 + cos(pi * e / t_max)) / 2,
    A = P during the first half period (e <= t_max), and A = B afterwards (the reference's
    restart branch, like torch's CosineAnnealingLR, re-enters with the base learning rate).
* W == 0 (the reference uses the plain torch schedulers):
  - multistep: lr = B * decay_rate ** n, n = number of milestones m with 1 <= m <= k + 1
    (a milestone m already applies to step m - 1; a milestone 0 is never reached).
  - cosine_annealing: lr = eta_min + (B - eta_min) * (1 + cos(pi * k / t_max)) / 2.

`lr_at` and `make_scheduler` (a torch LRScheduler whose `last_epoch` is k) both use this.
"""

from __future__ import annotations

import math
from typing import Any, Iterable

import torch

from hpckit.common.config import require
from hpckit.common.step import DeviceOptimizer

OPTIMIZERS = ("Adam", "AdamW", "LAMB")
SCHEDULES = ("multistep", "cosine_annealing")

_OPT_KEYS = ("name", "lr", "betas", "eps", "weight_decay",
             "bias_correction", "grad_averaging", "max_grad_norm")
_OPT_REQUIRED = ("name", "lr", "betas", "eps", "weight_decay")
_SCHED_KEYS = ("type", "milestones", "decay_rate", "t_max", "eta_min",
               "lr_warmup_steps", "lr_warmup_factor")


# ----------------------------------------------------------------------------- validation

def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _check_keys(cfg: Any, section: str, known: tuple[str, ...], required: Iterable[str]) -> None:
    require(isinstance(cfg, dict), section, f"expected a mapping, got {cfg!r}")
    for key in cfg:
        require(key in known, f"{section}.{key}", f"unknown key (known: {', '.join(known)})")
    for key in required:
        require(key in cfg, f"{section}.{key}", "missing")


def check_optimizer_config(cfg_opt: dict) -> dict:
    """Validate an `optimizer` section; return a normalized copy (all keys, plain types)."""
    _check_keys(cfg_opt, "optimizer", _OPT_KEYS, _OPT_REQUIRED)
    c = {"bias_correction": True, "grad_averaging": True, "max_grad_norm": 1.0, **cfg_opt}
    k = "optimizer."
    require(c["name"] in OPTIMIZERS, k + "name",
            f"expected one of {', '.join(OPTIMIZERS)}, got {c['name']!r}")
    require(_is_number(c["lr"]) and c["lr"] > 0, k + "lr",
            f"expected a number > 0, got {c['lr']!r}")
    betas = c["betas"]
    require(isinstance(betas, (list, tuple)) and len(betas) == 2
            and all(_is_number(b) and 0.0 <= b < 1.0 for b in betas),
            k + "betas", f"expected two numbers in [0, 1), got {betas!r}")
    require(_is_number(c["eps"]) and c["eps"] > 0, k + "eps",
            f"expected a number > 0, got {c['eps']!r}")
    require(_is_number(c["weight_decay"]) and c["weight_decay"] >= 0, k + "weight_decay",
            f"expected a number >= 0, got {c['weight_decay']!r}")
    for flag in ("bias_correction", "grad_averaging"):
        require(isinstance(c[flag], bool), k + flag, f"expected true/false, got {c[flag]!r}")
    mgn = c["max_grad_norm"]
    require(mgn is None or (_is_number(mgn) and mgn >= 0), k + "max_grad_norm",
            f"expected a number >= 0 (0 or null: no clipping), got {mgn!r}")
    return {
        "name": c["name"], "lr": float(c["lr"]), "betas": (float(betas[0]), float(betas[1])),
        "eps": float(c["eps"]), "weight_decay": float(c["weight_decay"]),
        "bias_correction": c["bias_correction"], "grad_averaging": c["grad_averaging"],
        "max_grad_norm": float(mgn or 0.0),
    }


def check_scheduler_config(cfg_sched: dict) -> dict:
    """Validate a `scheduler` section; return a normalized copy (all keys, plain types)."""
    _check_keys(cfg_sched, "scheduler", _SCHED_KEYS, ("type",))
    k = "scheduler."
    kind = cfg_sched["type"]
    require(kind in SCHEDULES, k + "type", f"expected one of {', '.join(SCHEDULES)}, got {kind!r}")
    c = {"lr_warmup_steps": 0, "lr_warmup_factor": 1.0, "eta_min": 0.0, **cfg_sched}
    out: dict = {"type": kind, "milestones": (), "decay_rate": 1.0, "t_max": 0, "eta_min": 0.0}
    if kind == "multistep":
        for key in ("milestones", "decay_rate"):
            require(key in c, k + key, "missing (required by the multistep schedule)")
        ms = c["milestones"]
        require(isinstance(ms, (list, tuple)) and all(_is_int(m) and m >= 0 for m in ms),
                k + "milestones", f"expected a list of integer steps >= 0, got {ms!r}")
        rate = c["decay_rate"]
        require(_is_number(rate) and 0 < rate <= 1, k + "decay_rate",
                f"expected a number in (0, 1], got {rate!r}")
        out.update(milestones=tuple(ms), decay_rate=float(rate))
    else:
        require("t_max" in c, k + "t_max", "missing (required by the cosine_annealing schedule)")
        t_max, eta_min = c["t_max"], c["eta_min"]
        require(_is_int(t_max) and t_max >= 1, k + "t_max",
                f"expected an integer >= 1, got {t_max!r}")
        require(_is_number(eta_min) and eta_min >= 0, k + "eta_min",
                f"expected a number >= 0, got {eta_min!r}")
        out.update(t_max=t_max, eta_min=float(eta_min))
    steps, factor = c["lr_warmup_steps"], c["lr_warmup_factor"]
    require(_is_int(steps) and steps >= 0, k + "lr_warmup_steps",
            f"expected an integer >= 0, got {steps!r}")
    require(_is_number(factor) and factor >= 1, k + "lr_warmup_factor",
            f"expected a number >= 1, got {factor!r}")
    out.update(lr_warmup_steps=steps, lr_warmup_factor=float(factor))
    return out


# ----------------------------------------------------------------------------- schedules

def _lr(k: int, base: float, s: dict) -> float:
    """The closed form described in the module docstring; `s` is a normalized config."""
    W, f = s["lr_warmup_steps"], s["lr_warmup_factor"]

    def warm(i: int) -> float:
        slope = 1.0 / W
        return base * (i * slope) if f == 1.0 else base * ((f - 1.0) * i * slope + 1.0)

    if W > 0 and k + 1 < W:
        return warm(k + 1)
    plateau = warm(W - 1) if W >= 2 else base
    if s["type"] == "multistep":
        if W == 0:
            n = sum(1 for m in s["milestones"] if 1 <= m <= k + 1)
        else:
            n = sum(1 for m in s["milestones"] if m + W <= k)
        return plateau * s["decay_rate"] ** n
    t_max, eta_min = s["t_max"], s["eta_min"]
    e = k if W == 0 else k + 1 - W
    amplitude = plateau if e <= t_max else base
    return eta_min + (amplitude - eta_min) * (1.0 + math.cos(math.pi * e / t_max)) / 2.0


def lr_at(step: int, base_lr: float, cfg_sched: dict) -> float:
    """Learning rate of optimizer step `step` (0-based: `step` optimizer steps came before).

    `base_lr` is the optimizer's configured learning rate; see the module docstring for the
    formula and how it maps onto the reference's scheduler.
    """
    if not _is_int(step) or step < 0:
        raise ValueError(f"step must be an integer >= 0, got {step!r}")
    if not _is_number(base_lr) or base_lr < 0:
        raise ValueError(f"base_lr must be a number >= 0, got {base_lr!r}")
    return _lr(step, float(base_lr), check_scheduler_config(cfg_sched))


class WarmupScheduler(torch.optim.lr_scheduler.LRScheduler):
    """LR scheduler following `lr_at`; `last_epoch` is the number of optimizer steps taken.

    Call `step()` once after every `optimizer.step()`. Each parameter group's base learning
    rate is its `initial_lr` (set from its `lr` when absent). `start_step` resumes a run
    after that many optimizer steps.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, cfg_sched: dict, start_step: int = 0):
        if not _is_int(start_step) or start_step < 0:
            raise ValueError(f"start_step must be an integer >= 0, got {start_step!r}")
        self.schedule = check_scheduler_config(cfg_sched)
        for group in optimizer.param_groups:
            group.setdefault("initial_lr", group["lr"])
        super().__init__(optimizer, last_epoch=start_step - 1)

    def get_lr(self) -> list[float]:
        return [_lr(self.last_epoch, base, self.schedule) for base in self.base_lrs]

    _get_closed_form_lr = get_lr


def make_scheduler(optimizer: torch.optim.Optimizer, cfg_sched: dict,
                   start_step: int = 0) -> WarmupScheduler:
    """The reference's warmup + multistep / cosine_annealing schedule for `optimizer`."""
    return WarmupScheduler(optimizer, cfg_sched, start_step)


# ----------------------------------------------------------------------------- LAMB

class LAMB(DeviceOptimizer):
    r"""LAMB (You et al., "Large Batch Optimization for Deep Learning: Training BERT in 76
    minutes", ICLR 2020, Algorithm 2) with the options of NVIDIA apex's FusedLAMB, which the
    DeepCAM reference uses (its defaults are the defaults here).

    At step t (counted per parameter group from 1), with g the gradient of tensor x:

    1. global clipping (over every gradient of every group, before anything else)::

           N = sqrt(sum over all grads of ||g||^2)
           g <- g / max(N / max_grad_norm, 1)          (skipped when max_grad_norm is 0/None)

    2. moments::

           m <- beta1 * m + c * g,   c = (1 - beta1) if grad_averaging else 1
           v <- beta2 * v + (1 - beta2) * g^2

    3. bias correction (if bias_correction, else m_hat = m, v_hat = v)::

           m_hat = m / (1 - beta1^t),   v_hat = v / (1 - beta2^t)

    4. Adam direction plus decoupled weight decay::

           u = m_hat / (sqrt(v_hat) + eps) + weight_decay * x

    5. per-tensor trust ratio and update::

           r = ||x|| / ||u||   (r = 1 when ||x|| == 0 or ||u|| == 0)
           x <- x - lr * r * u

    Multi-tensor: every step runs the same few dozen torch._foreach_* ops over the lists
    of a group's tensors, whatever their number (apex FusedLAMB's multi_tensor_apply
    kernels do the same math in fused CUDA kernels). The per-parameter Python loop this
    replaces dispatched ~20 ops per tensor and cost 119 ms of CPU per DeepCAM step on an
    H100 node while the GPU idled (issue 32). Nothing reads a value back to the host: the
    step counter, the bias corrections and the learning rate are device tensors, so a step
    can be captured in a CUDA graph (common/step.py); `sync_lr()` copies each group's `lr`
    (set by the scheduler) into its device tensor, outside a capture.

    Skipped steps: with `found_inf` (a 0-d tensor, non-zero when the step's gradients were
    not finite; GradScaler sets it as an attribute, `_step_supports_amp_scaling`) the
    update is skipped on the device: moments, step counter and weights stay as they were.
    The caller must have zeroed the non-finite gradients (common/step.FlatGrads does),
    since no arithmetic masks a NaN.

    Differences from apex FusedLAMB: apex skips the trust ratio for groups with
    weight_decay == 0 (unless use_nvlamb), here it always applies, as in the paper; apex
    reads max_grad_norm from the constructor only, and so does this class (a per-group
    value is ignored, the clipping norm is global); arithmetic happens in the parameter's
    dtype (apex: float32), so use float32 master weights for mixed precision. As apex,
    the step is counted per group: a tensor without a gradient at some step is left out of
    that step, and its bias correction then uses the group's count.
    """

    def __init__(self, params, lr: float = 1e-3, bias_correction: bool = True,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-6,
                 weight_decay: float = 0.01, grad_averaging: bool = True,
                 max_grad_norm: float | None = 1.0):
        if not lr >= 0.0:
            raise ValueError(f"invalid learning rate {lr!r}")
        if len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"invalid betas {betas!r}")
        if not eps > 0.0:
            raise ValueError(f"invalid eps {eps!r}")
        if not weight_decay >= 0.0:
            raise ValueError(f"invalid weight_decay {weight_decay!r}")
        if max_grad_norm is not None and not max_grad_norm >= 0.0:
            raise ValueError(f"invalid max_grad_norm {max_grad_norm!r}")
        defaults = dict(lr=lr, bias_correction=bool(bias_correction),
                        betas=(float(betas[0]), float(betas[1])), eps=eps,
                        weight_decay=weight_decay, grad_averaging=bool(grad_averaging),
                        max_grad_norm=max_grad_norm)
        super().__init__(params, defaults)

    def _clip_divisor(self, grads: list[torch.Tensor]) -> torch.Tensor | None:
        max_norm = self.defaults["max_grad_norm"]
        if not max_norm:
            return None
        acc = torch.float64 if any(g.dtype == torch.float64 for g in grads) else torch.float32
        norms = (torch._foreach_norm(grads) if all(g.dtype == acc for g in grads)
                 else torch._foreach_norm(grads, 2, dtype=acc))
        total = torch.linalg.vector_norm(torch.stack(norms))
        return torch.clamp(total / max_norm, min=1.0)

    def apply(self, groups: list, grads: list, ok: torch.Tensor) -> None:
        divisor = self._clip_divisor(grads)
        for index, group, params in groups:
            if params:
                self._update(group, params, divisor, ok, self.lr_tensor(index, group, grads[0].device))

    def _update(self, group: dict, params: list, divisor, ok: torch.Tensor, lr: torch.Tensor) -> None:
        beta1, beta2 = group["betas"]
        eps, wd = group["eps"], group["weight_decay"]
        dtype = params[0].dtype
        first = self.state[params[0]]
        if "step" not in first:   # one counter per group, shared by its tensors' states
            counter = torch.zeros((), dtype=torch.float64, device=params[0].device)
        else:
            counter = first["step"]
        for p in params:
            state = self.state[p]
            if not state or "exp_avg" not in state:
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["step"] = counter
        m = [self.state[p]["exp_avg"] for p in params]
        v = [self.state[p]["exp_avg_sq"] for p in params]
        g = [p.grad for p in params]
        if divisor is not None:
            g = torch._foreach_div(g, divisor.to(dtype))
        # a skipped step (not ok) leaves everything as it was: the moments' factors become 1
        # (their gradient terms are zeros), the count does not advance, the learning rate is 0
        counter.add_(ok.to(torch.float64))
        one = torch.ones((), dtype=dtype, device=ok.device)
        torch._foreach_mul_(m, torch.where(ok, torch.full_like(one, beta1), one))
        torch._foreach_add_(m, g, alpha=(1.0 - beta1) if group["grad_averaging"] else 1.0)
        torch._foreach_mul_(v, torch.where(ok, torch.full_like(one, beta2), one))
        torch._foreach_addcmul_(v, g, g, value=1.0 - beta2)
        if group["bias_correction"]:
            # in float64 as Python's beta ** t (1 - 0.999 ** t loses 4 digits in float32);
            # 1 before the first step (a skipped first step divides a zero moment by it)
            counted = counter > 0
            bc1 = torch.where(counted, 1.0 - torch.pow(beta1, counter), 1.0).to(dtype)
            bc2 = torch.where(counted, 1.0 - torch.pow(beta2, counter), 1.0).to(dtype)
            m_hat, v_hat = torch._foreach_div(m, bc1), torch._foreach_div(v, bc2)
        else:
            m_hat, v_hat = m, v
        denom = torch._foreach_sqrt(v_hat)
        torch._foreach_add_(denom, eps)
        update = torch._foreach_div(m_hat, denom)
        if wd != 0.0:
            torch._foreach_add_(update, params, alpha=wd)
        # trust ratio r = |x| / |u|, 1 where either is 0, from per-tensor 0-d norms:
        # s = sign|x| * sign|u| (1 where both are > 0), r = s * |x| / (|u| + 1 - sign|u|) + 1 - s
        # (each 1 - s is exactly 0 or 1, so |u| + (1 - sign|u|) is exactly |u| where |u| > 0)
        w_norm, u_norm = torch._foreach_norm(params), torch._foreach_norm(update)
        u_sign = torch._foreach_sign(u_norm)
        both = torch._foreach_mul(torch._foreach_sign(w_norm), u_sign)
        ratio = torch._foreach_div(w_norm, torch._foreach_add(u_norm, _one_minus(u_sign)))
        torch._foreach_mul_(ratio, both)
        torch._foreach_add_(ratio, _one_minus(both))
        torch._foreach_mul_(ratio, torch.where(ok, -lr, 0.0).to(dtype))
        torch._foreach_addcmul_(params, update, ratio)


def _one_minus(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    return torch._foreach_add(torch._foreach_neg(tensors), 1.0)


# ----------------------------------------------------------------------------- factories

def make_optimizer(params, cfg_opt: dict) -> torch.optim.Optimizer:
    """Adam / AdamW (torch.optim) or LAMB (above) from an `optimizer` config section."""
    c = check_optimizer_config(cfg_opt)
    common = dict(lr=c["lr"], betas=c["betas"], eps=c["eps"], weight_decay=c["weight_decay"])
    # fused: the implementation that takes GradScaler's found_inf and skips on the device
    # (common/step.py hands every optimizer the step's found_inf)
    if c["name"] == "Adam":
        return torch.optim.Adam(params, fused=True, **common)
    if c["name"] == "AdamW":
        return torch.optim.AdamW(params, fused=True, **common)
    return LAMB(params, bias_correction=c["bias_correction"], grad_averaging=c["grad_averaging"],
                max_grad_norm=c["max_grad_norm"], **common)


def mlperf_optimizer_keys(cfg_opt: dict, cfg_sched: dict) -> list[tuple[str, Any]]:
    """(key, value) pairs for the MLPerf log, in the reference's order.

    The reference logs `opt_name`, then every key of the optimizer's parameter group as
    `opt_<key>` (apex FusedLAMB's order: lr, bias_correction, betas, eps, weight_decay,
    grad_averaging, max_grad_norm; torch Adam's torch-version-specific extras such as
    amsgrad are left out), then every key of its scheduler arguments as `scheduler_<key>`.
    The keys are those of the hpc_3.0.0 closed_deepcam*.yaml rules, plus `opt_weight_decay`,
    which the reference logs and its README lists. `max_grad_norm` 0/None is logged as 0.0.
    """
    o = check_optimizer_config(cfg_opt)
    s = check_scheduler_config(cfg_sched)
    lamb = o["name"] == "LAMB"
    keys: list[tuple[str, Any]] = [("opt_name", o["name"]), ("opt_lr", o["lr"])]
    if lamb:
        keys.append(("opt_bias_correction", o["bias_correction"]))
    keys += [("opt_betas", list(o["betas"])), ("opt_eps", o["eps"]),
             ("opt_weight_decay", o["weight_decay"])]
    if lamb:
        keys += [("opt_grad_averaging", o["grad_averaging"]),
                 ("opt_max_grad_norm", o["max_grad_norm"])]
    keys.append(("scheduler_type", s["type"]))
    if s["type"] == "multistep":
        keys += [("scheduler_milestones", list(s["milestones"])),
                 ("scheduler_decay_rate", s["decay_rate"])]
    else:
        keys += [("scheduler_t_max", s["t_max"]), ("scheduler_eta_min", s["eta_min"])]
    keys += [("scheduler_lr_warmup_steps", s["lr_warmup_steps"]),
             ("scheduler_lr_warmup_factor", s["lr_warmup_factor"])]
    return keys
