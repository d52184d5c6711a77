"""OC20 training: the force loss, forces MAE, the PyTorch loop, and the run from data to verdict.

Reads top to bottom: config -> LMDB files -> cache clear -> init (model, AdamW, warm-up and
step schedule) -> run_start -> staging -> loaders -> epochs (train, evaluate forces MAE on
the validation split) -> run_stop. The run's lifecycle lives in hpckit.common.lifecycle, its protocol in
hpckit.common.run.

As the reference's MLPerfForcesTrainer (mlcommons/hpc@2c627d4
open_catalyst/ocpmodels/trainers/mlperf_forces_trainer.py), run as its run scripts run it,
under torch.distributed (scripts/run_training.sh: main.py --distributed):
  * loss (:609-691, base_trainer.py:321-337, modules/loss.py:21-40 DDPLoss):
    force_coefficient x L1 of the forces on free atoms, targets normalised by
    grad_target_std; DDPLoss makes it the sum of |error| over the free atoms' components x
    world size / the free atoms of all ranks (DDP then averages: the mean per free atom over
    the global batch); energy_coefficient x the same on the normalised energies (0 in the
    closed config: force-only training);
  * optimizer: AdamW(lr_initial) with torch's defaults (base_trainer.py:371-375), one
    LambdaLR step per training step (:567) of utils.py:66-87 warmup_lr_lambda: linear from
    warmup_factor to 1 over warmup_steps, then x lr_gamma at each milestone;
  * evaluation every epoch on the validation split (:522-559): forces MAE over the free
    atoms' components in eV/A (denormalised, evaluator.py:271-277 totals summed over ranks),
    logged as eval_error; the run stops at the target.
"""

from __future__ import annotations

import bisect
import math

import torch

from hpckit.common import lifecycle, precision
from hpckit.common.step import FP16_PATIENCE
from hpckit.common.config import check_auto_or_count, load_pytorch_config, require
from hpckit.common.lifecycle import Parts
from hpckit.common.mllog import C
from hpckit.common.run import (Diverged, LogStyle, StageAs, check_finite, claim_output_dir, diagnosed,
                               equal_train_split, launch)
from hpckit.oc20 import BENCHMARK, DESCRIPTOR, data
from hpckit.oc20.model import build_model, validate_model_config

# the reference's event order (mlcommons/hpc@2c627d4 open_catalyst/ocpmodels/trainers/
# mlperf_forces_trainer.py:385-424): cache_clear before init_start; eval_error between
# eval_stop and epoch_stop (:532-537)
LOG_STYLE = LogStyle(cache_clear_first=True, metric_at="after_eval")


def validate_config(cfg: dict) -> None:
    d, t, o = cfg["data"], cfg["train"], cfg["optimizer"]
    for key in ("n_train", "n_valid", "batch_size", "eval_batch_size", "prefetch"):
        require(isinstance(d[key], int) and not isinstance(d[key], bool) and d[key] >= 1, f"data.{key}",
                f"must be an integer >= 1 (got {d[key]!r})")
    check_auto_or_count(d["loader_workers"], "data.loader_workers")
    for key in ("target_std", "grad_target_std"):
        require(isinstance(d[key], (int, float)) and d[key] > 0, f"data.{key}", f"must be > 0 (got {d[key]!r})")
    require(t["n_epochs"] >= 1, "train.n_epochs", "must be >= 1")
    require(isinstance(t["target_mae"], (int, float)) and t["target_mae"] > 0, "train.target_mae",
            f"must be a forces MAE > 0 in eV/A (got {t['target_mae']!r})")
    for key in ("energy_coefficient", "force_coefficient"):
        require(isinstance(t[key], (int, float)) and t[key] >= 0, f"train.{key}", f"must be >= 0 (got {t[key]!r})")
    require(t["energy_coefficient"] + t["force_coefficient"] > 0, "train.force_coefficient",
            "the energy and force coefficients are both 0: nothing to train")
    require(o["name"] == "AdamW", "optimizer.name", f"the reference trains with AdamW (got {o['name']!r})")
    require(isinstance(o["lr"], (int, float)) and o["lr"] >= 0, "optimizer.lr", f"must be >= 0 (got {o['lr']!r})")
    require(isinstance(o["warmup_steps"], int) and o["warmup_steps"] >= 0, "optimizer.warmup_steps",
            f"must be an integer >= 0 (got {o['warmup_steps']!r})")
    require(0 <= o["warmup_factor"] <= 1, "optimizer.warmup_factor", f"must be in [0, 1] (got {o['warmup_factor']!r})")
    ms = o["lr_milestones"]
    require(isinstance(ms, list) and all(isinstance(m, int) and m > 0 for m in ms) and ms == sorted(ms),
            "optimizer.lr_milestones", f"must be ascending step numbers (got {ms!r})")
    require(0 < o["lr_gamma"] <= 1, "optimizer.lr_gamma", f"must be in (0, 1] (got {o['lr_gamma']!r})")
    require(isinstance(o["betas"], list) and len(o["betas"]) == 2 and all(0 <= b < 1 for b in o["betas"]),
            "optimizer.betas", f"must be two numbers in [0, 1) (got {o['betas']!r})")
    validate_model_config(cfg)


def lr_factor(step: int, o: dict) -> float:
    """warmup_lr_lambda (utils.py:82-87): the factor of the base learning rate after `step`
    scheduler steps."""
    if step <= o["warmup_steps"]:
        alpha = step / float(o["warmup_steps"]) if o["warmup_steps"] else 1.0
        return o["warmup_factor"] * (1.0 - alpha) + alpha
    return o["lr_gamma"] ** bisect.bisect(o["lr_milestones"], step)


def hyperparameters(cfg: dict, global_batch: int) -> list[tuple[str, object]]:
    """The reference's keys in its order (mlperf_forces_trainer.py:406-420)."""
    o = cfg["optimizer"]
    return [
        (C.GLOBAL_BATCH_SIZE, global_batch),
        (C.TRAIN_SAMPLES, cfg["data"]["n_train"]),
        (C.EVAL_SAMPLES, cfg["data"]["n_valid"]),
        (C.OPT_NAME, o["name"]),
        (C.OPT_BASE_LR, o["lr"]),
        (C.OPT_LR_WARMUP_STEPS, o["warmup_steps"]),
        (C.OPT_LR_WARMUP_FACTOR, o["warmup_factor"]),
        (C.OPT_LR_DECAY_BOUNDARY_STEPS, o["lr_milestones"]),
        (C.OPT_LR_DECAY_FACTOR, o["lr_gamma"]),
    ]


def force_loss_terms(forces, batch, cfg: dict):
    """(sum of |error| of the normalised forces over the loss atoms' components, number of
    loss atoms) of one batch: the parts of DDPLoss(L1Loss) (modules/loss.py:29-38)."""
    d, t = cfg["data"], cfg["train"]
    target = batch["force"]
    if d["normalize_labels"]:
        target = (target - d["grad_target_mean"]) / d["grad_target_std"]
    if t["train_on_free_atoms"]:
        mask = batch["fixed"] == 0
        forces, target = forces[mask], target[mask]
    return (forces.float() - target).abs().sum(), forces.shape[0]


def energy_loss_terms(energy, batch, cfg: dict):
    d = cfg["data"]
    target = batch["y"]
    if d["normalize_labels"]:
        target = (target - d["target_mean"]) / d["target_std"]
    return (energy.float() - target).abs().sum(), energy.shape[0]


def forces_error(forces, batch, cfg: dict) -> tuple[float, int]:
    """(sum of |F_pred - F| in eV/A over the evaluated atoms' components, their number)
    (_compute_metrics :693-735 with evaluator.absolute_error)."""
    d, t = cfg["data"], cfg["train"]
    pred = forces.float()
    if d["normalize_labels"]:
        pred = pred * d["grad_target_std"] + d["grad_target_mean"]
    target = batch["force"]
    if t["eval_on_free_atoms"]:
        mask = batch["fixed"] == 0
        pred, target = pred[mask], target[mask]
    return float((pred - target).abs().sum()), int(pred.numel())


class Trainer:
    def __init__(self, cfg: dict, launched):
        torch.manual_seed(launched.seed)
        self.cfg, self.device, self.comm = cfg, launched.device, launched.comm
        self.size = launched.ranks.size
        self.model = build_model(cfg).to(self.device)
        self.net = self.comm.wrap_model(self.model) if self.comm.kind in ("torch", "horovod") else self.model
        o = cfg["optimizer"]
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=o["lr"], betas=tuple(o["betas"]), eps=o["eps"],
                                           weight_decay=o["weight_decay"])
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda step: lr_factor(step, o))
        self.scaler = precision.grad_scaler(cfg["train"]["precision"], self.device)
        self.steps = 0
        self.overflows = 0   # consecutive fp16 steps whose gradients overflowed (skipped)

    def loss(self, energy, forces, batch):
        t = self.cfg["train"]
        terms = []
        if t["force_coefficient"]:
            terms.append((t["force_coefficient"], *force_loss_terms(forces, batch, self.cfg)))
        if t["energy_coefficient"]:
            terms.append((t["energy_coefficient"], *energy_loss_terms(energy, batch, self.cfg)))
        # the reference all-reduces each term's element count every step (DDPLoss)
        counts = self.comm.allreduce_sum([float(n) for _, _, n in terms]) if self.size > 1 else \
            [float(n) for _, _, n in terms]
        return sum(coef * total * self.size / max(count, 1.0) for (coef, total, _), count in zip(terms, counts))

    def train_epoch(self, batches) -> int:
        self.model.train()
        n = 0
        for batch in batches:
            batch = data.to_device(batch, self.device)
            with precision.torch_autocast(self.cfg["train"]["precision"], self.device):
                energy, forces = self.net(batch)
            loss = self.loss(energy, forces, batch)
            self.optimizer.zero_grad(set_to_none=True)
            if self.scaler is not None:
                self.scaler.scale(loss).backward()
                self.scaler.unscale_(self.optimizer)
            else:
                loss.backward()
            if self.comm.kind == "horovod":
                self.comm.average_gradients(self.model.parameters())
            grads = [p.grad for p in self.model.parameters() if p.grad is not None]
            norm = float(torch.stack(torch._foreach_norm(grads)).norm())
            if self.scaler is None:
                check_finite(norm, self.steps + 1, "the gradient norm")
            elif not math.isfinite(norm):
                # fp16: an overflow at the current loss scale; GradScaler skips this update
                # and halves the scale (as the reference's --amp does); a run of them is a
                # diverged training, as the kit's other trainers judge it (common/step.py)
                self.overflows += 1
                if self.overflows >= FP16_PATIENCE:
                    raise Diverged(f"the gradient norm is not finite in {FP16_PATIENCE} consecutive training steps "
                                   f"up to step {self.steps + 1} under fp16 loss scaling: the training diverged (a "
                                   "learning rate too high, or non-finite input data)")
            else:
                self.overflows = 0
            if self.scaler is not None:
                self.scaler.step(self.optimizer)
                self.scaler.update()
            else:
                self.optimizer.step()
            self.scheduler.step()
            n += int(batch["natoms"].numel())
            self.steps += 1
        return n

    def evaluate(self, batches) -> tuple[float, int, int]:
        """(sum of absolute force errors, components, samples) of this rank's share."""
        self.model.eval()
        total, count, samples = 0.0, 0, 0
        for batch in batches:
            batch = data.to_device(batch, self.device)
            with precision.torch_autocast(self.cfg["train"]["precision"], self.device):
                _, forces = self.model(batch)
            err, k = forces_error(forces.detach(), batch, self.cfg)
            total, count, samples = total + err, count + k, samples + int(batch["natoms"].numel())
        return total, count, samples

    def fingerprint(self) -> float:
        return float(sum(p.detach().double().abs().sum().item() for p in self.model.parameters()))


class OC20Parts(Parts):
    """OpenCatalyst's parts of the run (common/lifecycle.py): the Trainer, each node's share of
    the records staged as one LMDB of its own, their loaders, the forces MAE."""

    descriptor, style = DESCRIPTOR, LOG_STYLE

    def __init__(self, cfg: dict, launched, global_batch: int, files: dict, per_rank: int, dropped: int):
        super().__init__(cfg, launched, global_batch)
        self.files, self.per_rank, self.dropped = files, per_rank, dropped

    def hyperparameters(self):
        return hyperparameters(self.cfg, self.global_batch)

    def input_files(self):
        return [p for split in self.files.values() for p in split.files]

    def build(self, run):
        self.trainer = Trainer(self.cfg, self.launched)

    def prepare(self, run):
        cfg, launched = self.cfg, self.launched
        # a node stages its share of the records (every nodes-th) as an LMDB of its own
        stage_as = StageAs(write=data.stage_share, relocate=data.staged,
                           written_as="the node's records, one LMDB (data.0000.lmdb)")
        self.reading = run.stage_and_shard(self.files, self.per_rank, self.dropped, cfg["data"]["batch_size"],
                                           launched.stage_dir, cfg["data"]["shuffle"], stage_as)
        self.loaders = {name: data.torch_loader(r.files, cfg, name == "train", launched.seed, r.sampler)
                        for name, r in self.reading.items()}

    def batches(self, name: str):
        split = self.reading[name].files
        where = str(split.files[0].parent) if split.files else name
        return diagnosed(self.loaders[name], lambda: data.find_bad_record(split), where)

    def train_epoch(self, epoch, run):
        n = self.trainer.train_epoch(run.limited(self.batches("train")))
        return self.comm.allreduce_sum([n])[0]

    def evaluate(self):
        total, count, samples = self.comm.allreduce_sum(list(self.trainer.evaluate(self.batches("validation"))))
        return (total / count if count else float("nan")), samples

    def fingerprint(self):
        return self.trainer.fingerprint()


def train(args) -> int:
    cfg = load_pytorch_config(args, BENCHMARK, "OC20", validate_config)
    claim_output_dir(args.output_dir, getattr(args, "instances", 1))
    launched = launch(args, "pytorch", cfg)
    global_batch = cfg["data"]["batch_size"] * launched.ranks.size
    files = data.find_dataset(args.data, cfg["data"]["n_train"], cfg["data"]["n_valid"],
                              need_graph=not cfg["model"]["otf_graph"])
    files["train"], per_rank, dropped = equal_train_split(files["train"], launched.ranks, cfg["data"]["batch_size"])
    return lifecycle.train(OC20Parts(cfg, launched, global_batch, files, per_rank, dropped), args.output_dir)
