"""One training step of the PyTorch back ends, written once for every benchmark.

    forward (autocast) -> loss (x loss scale for fp16) -> backward into one flat gradient
    buffer -> [Horovod average] -> [unscale] -> gradient norm -> non-finite guard (on the
    device) -> non-finite gradients zeroed, the update skipped on the device -> optimizer
    step -> [loss-scale update] -> gradients zeroed

Nothing in a step reads a value back to the host, so the CPU queues step after step while
the GPU works (on an H100 a read-back per step, a Python loop over LAMB's tensors and
pageable copies left DeepCAM's step at 0.41x the reference's: issue 32):

* gradients live in one buffer (`FlatGrads`): each parameter's .grad is a view of it, so
  their norm is one reduction, zeroing one fill, and a step whose gradients are not finite
  is made harmless by one masked fill (no arithmetic removes a NaN);
* the non-finite guard (`NonFiniteGuard`) keeps on the device the first step whose gradient
  norm was not finite and the run of consecutive ones; the host reads it every
  `CHECK_EVERY` steps and at the end of each epoch, and the run stops there naming the
  first bad step (the steps in between were skipped on the device, as GradScaler skips
  them). fp32/bf16 stop at the first; fp16 skips an overflowing step (the loss scale
  halves) and stops after `FP16_PATIENCE` in a row;
* `train.cuda_graph`: the whole step (forward, backward, guard, optimizer) is captured
  once in a CUDA graph after `GRAPH_WARMUP` eager steps and replayed from static input
  buffers (torch.cuda.graph; NVIDIA's v3.0 DeepCAM captures forward, backward, LAMB and
  GradScaler the same way: ../shared/reference/nvidia-v3-gpu-facts.md);
* `prefetched()` copies the next batch to the GPU on a side stream while this one trains.

`resolve_options` turns the config's `auto`s into what runs (logged in hpckit_config):
memory format channels_last(_3d) on CUDA, contiguous on CPUs; the CUDA graph on CUDA for a
single process without gradient accumulation and with the kit's own optimizers.
"""

from __future__ import annotations

import collections
import contextlib
import sys

import torch

from hpckit.common import precision
from hpckit.common.errors import KitError
from hpckit.common.run import Diverged

CHECK_EVERY = 25       # steps between two read-backs of the non-finite guard
FP16_PATIENCE = 20     # consecutive overflowing fp16 steps that end a run (2^16 scale / 2^20)
GRAPH_WARMUP = 3       # eager steps before the capture (lazy state: optimizer, cuBLAS, cuDNN)
GRAPH_OPTIMIZERS = ("LAMB", "sgd")   # optimizers whose step is capturable (device-side lr)
MEMORY_FORMATS = ("auto", "channels_last", "contiguous")


# ---------------------------------------------------------------- options

def _choice(cfg: dict, key: str, choices: tuple) -> str:
    value = cfg["train"][key]
    if isinstance(value, bool):
        value = "true" if value else "false"
    if value not in choices:
        raise KitError(f"config key 'train.{key}': {value!r} is not one of {', '.join(map(str, choices))}")
    return value


def resolve_options(cfg: dict, device, single_process: bool, optimizer: str) -> None:
    """train.memory_format and train.cuda_graph: `auto` resolved for this device and run,
    an explicit choice that cannot run refused in one line (before staging)."""
    cuda = getattr(device, "type", "cpu") == "cuda"
    fmt = _choice(cfg, "memory_format", MEMORY_FORMATS)
    cfg["train"]["memory_format"] = ("channels_last" if cuda else "contiguous") if fmt == "auto" else fmt
    graph = _choice(cfg, "cuda_graph", ("auto", "true", "false"))
    accumulate = cfg["train"].get("gradient_accumulation_frequency", 1)
    why_not = (None if cuda else "it needs --device cuda") or \
              (None if single_process else "the kit captures single-process runs only (DDP and Horovod "
                                               "all-reduces are not captured)") or \
              (None if accumulate == 1 else "the kit captures one micro-batch per step "
                                            "(train.gradient_accumulation_frequency 1)") or \
              (None if optimizer in GRAPH_OPTIMIZERS else f"optimizer {optimizer} reads its learning rate on "
                                                           f"the host (capturable: {', '.join(GRAPH_OPTIMIZERS)})")
    if graph == "true" and why_not:
        raise KitError(f"config key 'train.cuda_graph': true, but {why_not}; use auto or false")
    cfg["train"]["cuda_graph"] = graph == "true" or (graph == "auto" and why_not is None)
    if cuda and not cfg["train"]["deterministic"]:
        # cuDNN picks each convolution's fastest algorithm by timing them, as the DeepCAM
        # reference asks (mlcommons/hpc@2c627d4 deepcam/src/deepCam/train.py:80) and as
        # TensorFlow, the CosmoFlow reference's framework, does by default; a deterministic
        # run keeps cuDNN's fixed choice (common/determinism.py)
        torch.backends.cudnn.benchmark = True


def torch_memory_format(cfg: dict, dims: int):
    """The torch memory format of the resolved train.memory_format for `dims` spatial dims."""
    if cfg["train"]["memory_format"] != "channels_last":
        return torch.contiguous_format
    return torch.channels_last if dims == 2 else torch.channels_last_3d


# ---------------------------------------------------------------- gradients and guard

def _dense(t: torch.Tensor) -> bool:
    """Non-overlapping and dense in some order of its dimensions (contiguous, channels_last)."""
    expected = 1
    for size, stride in sorted(zip(t.shape, t.stride()), key=lambda d: d[1]):
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True


class FlatGrads:
    """Every parameter's gradient as a view of one buffer, in the parameter's own layout
    (autograd, DDP and Horovod then accumulate, copy and average into it in place). Make it
    after the model has its device and memory format (Module.to replaces gradients) and
    never set a .grad to None afterwards: zero_() is the kit's zero_grad."""

    def __init__(self, params):
        self.params = [p for p in params if p.requires_grad]
        kinds = {(p.dtype, p.device) for p in self.params}
        if len(kinds) != 1:
            raise ValueError(f"FlatGrads needs one dtype and device, got {sorted(map(str, kinds))}")
        dtype, device = kinds.pop()
        self.buffer = torch.zeros(sum(p.numel() for p in self.params), dtype=dtype, device=device)
        offset = 0
        for p in self.params:
            if not _dense(p):
                raise ValueError(f"FlatGrads: a parameter of shape {tuple(p.shape)} is not dense")
            p.grad = self.buffer.as_strided(p.shape, p.stride(), offset)
            offset += p.numel()

    def zero_(self) -> None:
        self.buffer.zero_()

    def norm(self) -> torch.Tensor:
        return torch.linalg.vector_norm(self.buffer)

    def zero_where(self, bad: torch.Tensor) -> None:
        """Zero every gradient when the 0-d bool `bad` is true (NaN included), on the device."""
        self.buffer.masked_fill_(bad, 0.0)

    def intact(self) -> bool:
        """Every .grad still a view of the buffer (a test's and a debugger's check)."""
        return all(p.grad is not None and p.grad.untyped_storage().data_ptr()
                   == self.buffer.untyped_storage().data_ptr() for p in self.params)


class NonFiniteGuard:
    """The non-finite gradients of a run, recorded on the device, read by the host every
    few steps: the first bad step and its norm, the current run of consecutive bad steps,
    the step at which that run reached `patience`, and the number of skipped steps."""

    def __init__(self, device, patience: int = 1):
        z = dict(dtype=torch.int64, device=device)
        self.patience = patience
        self.steps = torch.zeros((), **z)
        self.first = torch.zeros((), **z)          # 1-based step of the first bad gradient; 0: none
        self.first_norm = torch.zeros((), dtype=torch.float32, device=device)
        self.streak = torch.zeros((), **z)
        self.stop_at = torch.zeros((), **z)        # step at which `patience` bad steps in a row were reached
        self.skipped = torch.zeros((), **z)

    def observe(self, norm: torch.Tensor) -> torch.Tensor:
        """Record this step's gradient norm; returns the 0-d bool `skip`: the norm is not
        finite, or the run has already met its stop (the host has not read it yet: from
        there on nothing changes the weights, so the run ends with those of the step before)."""
        bad = ~torch.isfinite(norm)
        b = bad.to(torch.int64)
        self.steps.add_(1)
        self.skipped.add_(b)
        self.streak.mul_(b).add_(b)
        fresh = bad & (self.first == 0)
        self.first.copy_(torch.where(fresh, self.steps, self.first))
        self.first_norm.copy_(torch.where(fresh, norm.float(), self.first_norm))
        self.stop_at.copy_(torch.where((self.streak >= self.patience) & (self.stop_at == 0), self.steps,
                                       self.stop_at))
        return bad | (self.stop_at != 0)

    def check(self, step_offset: int = 0) -> None:
        """Raise Diverged if the run must stop (one read-back); `step_offset` + the guard's
        step is the run's training step (the guard counts optimizer steps)."""
        stop_at, first, value = (int(self.stop_at), int(self.first), float(self.first_norm))
        if not stop_at:
            return
        if self.patience == 1:
            raise Diverged(f"the gradient norm is {value} at training step {first + step_offset}: the training "
                           "diverged (a learning rate too high, or non-finite input data)")
        raise Diverged(f"the gradient norm is not finite in {self.patience} consecutive training steps up to "
                       f"step {stop_at + step_offset} (first at step {first + step_offset}: {value}) under fp16 "
                       "loss scaling: the training diverged (a learning rate too high, or non-finite input data)")

    def skipped_steps(self) -> int:
        return int(self.skipped)


# ---------------------------------------------------------------- optimizers

class DeviceOptimizer(torch.optim.Optimizer):
    """Base of the kit's own optimizers (DeepCAM's LAMB, CosmoFlow's Keras SGD): the learning
    rate of each group read from a device tensor (a step can be captured in a CUDA graph;
    `sync_lr()` copies the groups' `lr`, which the schedules set, into it: an eager step()
    does so itself, the graph's replay after it) and GradScaler's contract (a `found_inf`
    attribute or argument: the update skipped on the device)."""

    _step_supports_amp_scaling = True

    def __init__(self, params, defaults: dict):
        super().__init__(params, defaults)
        self._lr: dict[int, torch.Tensor] = {}      # group index -> its learning rate on the device

    def lr_tensor(self, index: int, group: dict, device) -> torch.Tensor:
        lr = self._lr.get(index)
        if lr is None or lr.device != device:
            lr = self._lr[index] = torch.zeros((), dtype=torch.float64, device=device)
            lr.fill_(group["lr"])
        return lr

    def sync_lr(self) -> None:
        for index, group in enumerate(self.param_groups):
            if index in self._lr:
                self._lr[index].fill_(group["lr"])

    @torch.no_grad()
    def step(self, closure=None, found_inf: torch.Tensor | None = None):
        """The update of every tensor with a gradient: apply(groups, grads, ok), `groups`
        (index, group, its tensors with a gradient), `ok` a 0-d bool (False: skip)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        groups = [(i, g, [p for p in g["params"] if p.grad is not None]) for i, g in enumerate(self.param_groups)]
        grads = [p.grad for _, _, ps in groups for p in ps]
        if grads:
            if any(g.is_sparse for g in grads):
                raise RuntimeError(f"{type(self).__name__} does not support sparse gradients")
            self.apply(groups, grads, self.prepare(grads, found_inf))
        return loss

    def apply(self, groups: list, grads: list, ok: torch.Tensor) -> None:
        raise NotImplementedError

    def prepare(self, grads: list, found_inf) -> torch.Tensor:
        """At the start of step(): the lr copied (unless a graph is being captured), still
        scaled gradients (GradScaler's grad_scale) unscaled; returns the 0-d bool `ok`."""
        device = grads[0].device
        if not (device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
            self.sync_lr()
        scale = getattr(self, "grad_scale", None)
        if scale is not None:
            torch._foreach_div_(grads, scale.to(device=device, dtype=grads[0].dtype))
        if found_inf is None:
            found_inf = getattr(self, "found_inf", None)
        return (torch.ones((), dtype=torch.bool, device=device) if found_inf is None
                else found_inf.to(device) == 0)


# ---------------------------------------------------------------- the step

class TrainStep:
    """The step of one PyTorch trainer (see the module docstring).

    forward(x, y) -> (loss, aux): the trainer's forward pass and loss (it applies
    self.autocast() around the network), `aux` anything the trainer keeps of the last
    batch (DeepCAM's logits); backward is the step's. `no_sync()`: DDP's context for a
    micro-batch whose gradients are not all-reduced yet. `before_update()`: what runs
    between the last backward and the update (Horovod's average). The optimizer follows
    GradScaler's contract: step() reads an attribute `found_inf` and skips on the device."""

    def __init__(self, *, params, optimizer, forward, device, precision_name: str, cuda_graph: bool = False,
                 no_sync=None, before_update=None):
        self.optimizer, self.forward, self.device = optimizer, forward, device
        self.precision = precision_name
        self.no_sync, self.before_update = no_sync, before_update
        self.flat = FlatGrads(params)
        self.scaler = precision.grad_scaler(precision_name, device)
        self.guard = NonFiniteGuard(device, FP16_PATIENCE if precision_name == "fp16" else 1)
        self.cuda_graph = cuda_graph
        self.graph = None
        self.graph_error = None  # why the capture failed (the run then went on eager)
        self.static = None      # (x, y, loss, aux) of the captured step
        self.eager_steps = 0
        self.updates = 0        # optimizer steps taken

    def autocast(self):
        return precision.torch_autocast(self.precision, self.device)

    # -- eager -----------------------------------------------------------------------
    def backward(self, x, y, sync: bool = True):
        """One micro-batch: forward, loss, backward (accumulating into the gradients)."""
        context = self.no_sync() if (not sync and self.no_sync is not None) else contextlib.nullcontext()
        with context:
            loss, aux = self.forward(x, y)
            (self.scaler.scale(loss) if self.scaler is not None else loss).backward()
        return loss.detach(), aux

    def update(self) -> None:
        """The optimizer step over the accumulated gradients, skipped on the device when
        they are not finite; the gradients are zero afterwards."""
        if self.before_update is not None:
            self.before_update()
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        bad = self.guard.observe(self.flat.norm())
        self.flat.zero_where(bad)
        if self.scaler is not None:
            # GradScaler hands the optimizer its own found_inf (from unscale_): made to
            # include the guard's stop, so a doomed run's weights stay as they were
            for found in self.scaler._found_inf_per_device(self.optimizer).values():
                found.copy_(torch.maximum(found, bad.to(found.dtype)))
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.found_inf = bad.to(self.flat.buffer.dtype)
            try:
                self.optimizer.step()
            finally:
                del self.optimizer.found_inf
        self.flat.zero_()

    def step(self, x, y):
        """One training step on one micro-batch (no accumulation): eager, or the CUDA graph."""
        if self.cuda_graph and self.device.type == "cuda":
            out = self._graphed(x, y)
        else:
            out = self.backward(x, y)
            self.update()
        self._counted()
        return out

    def accumulated(self, x, y, last: bool):
        """A micro-batch of a step with gradient accumulation; `last` ends the step."""
        out = self.backward(x, y, sync=last)
        if last:
            self.update()
            self._counted()
        return out

    def _counted(self) -> None:
        self.updates += 1
        if self.updates % CHECK_EVERY == 0:
            self.check()

    def check(self) -> None:
        """Read the guard back (every CHECK_EVERY steps, and at the end of each epoch)."""
        self.guard.check()

    # -- CUDA graph ------------------------------------------------------------------
    def _graphed(self, x, y):
        if self.graph is None and self.eager_steps < GRAPH_WARMUP:
            self.eager_steps += 1
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                out = self.backward(x, y)
                self.update()
            torch.cuda.current_stream(self.device).wait_stream(side)
            return out
        if self.graph is None:
            try:
                self._capture(x, y)
            except RuntimeError as e:   # the step as captured could not be: the run goes on eager, and says so
                first = (str(e).strip().splitlines() or [type(e).__name__])[0]
                print(f"hpckit train: warning: train.cuda_graph: the step could not be captured ({first[:200]}); "
                      "this run's steps are eager", file=sys.stderr, flush=True)
                self.cuda_graph, self.graph_error = False, first
                torch.cuda.synchronize(self.device)
                if self.scaler is not None:   # a capture cut short may leave it mid-step
                    from torch.amp.grad_scaler import _refresh_per_optimizer_state
                    self.scaler._per_optimizer_states = collections.defaultdict(_refresh_per_optimizer_state)
                out = self.backward(x, y)
                self.update()
                return out
        sx, sy, loss, aux = self.static
        if x.shape != sx.shape or y.shape != sy.shape or x.stride() != sx.stride():
            out = self.backward(x, y)      # a batch of another shape: eager (train batches drop the rest)
            self.update()
            return out
        sx.copy_(x, non_blocking=True)
        sy.copy_(y, non_blocking=True)
        if hasattr(self.optimizer, "sync_lr"):
            self.optimizer.sync_lr()
        self.graph.replay()
        return loss, aux

    def _capture(self, x, y) -> None:
        sx = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=self.device)
        sy = torch.empty_strided(y.shape, y.stride(), dtype=y.dtype, device=self.device)
        torch.cuda.synchronize(self.device)
        graph = torch.cuda.CUDAGraph()
        # thread_local: the DataLoader's pin-memory thread allocates pinned memory meanwhile
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            loss, aux = self.backward(sx, sy)
            self.update()
        self.graph, self.static = graph, (sx, sy, loss, aux)


# ---------------------------------------------------------------- input

def prefetched(batches, to_device, device):
    """(x, y) on the device, batch after batch: on CUDA each batch's host-to-device copy
    (and the device-side transform of `to_device`) is issued on a side stream right after
    the previous batch's step was queued, so it overlaps that step on the GPU."""
    if getattr(device, "type", "cpu") != "cuda":
        for x, y in batches:
            yield to_device(x, y, device)
        return
    main, side = torch.cuda.current_stream(device), torch.cuda.Stream(device)

    def load(batch):
        with torch.cuda.stream(side):
            return to_device(*batch, device)

    it = iter(batches)
    first = next(it, None)
    if first is None:
        return
    current = load(first)
    while True:
        main.wait_stream(side)
        for t in current:
            t.record_stream(main)
        yield current
        nxt = next(it, None)
        if nxt is None:
            return
        current = load(nxt)
