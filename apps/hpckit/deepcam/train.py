"""DeepCAM training: loss, IoU, the PyTorch loop, and the run from data to verdict.

Reads top to bottom: config -> dataset files and stats.h5 -> cache clear -> init (model,
optimizer, schedule) -> run_start -> staging -> loaders -> epochs (train with gradient
accumulation, evaluate mean IoU) -> run_stop. The run's lifecycle lives in
hpckit.common.lifecycle, its protocol in hpckit.common.run.
"""

from __future__ import annotations

import torch

from hpckit.common import lifecycle, step
from hpckit.deepcam import optim
from hpckit.common.config import check_auto_or_count, load_pytorch_config, require
from hpckit.common.errors import KitError
from hpckit.common.lifecycle import Parts
from hpckit.common.mllog import C
from hpckit.common.run import LogStyle, claim_output_dir, diagnosed, equal_train_split, launch
from hpckit.deepcam import BENCHMARK, DESCRIPTOR, data
from hpckit.deepcam.model import build_model, validate_model_config



def validate_config(cfg: dict) -> None:
    d, t = cfg["data"], cfg["train"]
    for key in ("n_train", "n_valid", "batch_size", "prefetch", "n_channels"):
        require(isinstance(d[key], int) and d[key] >= 1, f"data.{key}", f"must be an integer >= 1 (got {d[key]!r})")
    check_auto_or_count(d["loader_workers"], "data.loader_workers")
    require(t["n_epochs"] >= 1, "train.n_epochs", "must be >= 1")
    require(0.0 < t["target_iou"] <= 1.0, "train.target_iou", f"must be in (0, 1] (got {t['target_iou']})")
    require(t["gradient_accumulation_frequency"] >= 1, "train.gradient_accumulation_frequency", "must be >= 1")
    freqs = t["class_frequencies"]
    require(len(freqs) == cfg["model"]["n_classes"] and all(0 < f <= 1 for f in freqs),
            "train.class_frequencies", "one frequency in (0, 1] per class")
    validate_model_config(cfg)
    optim.check_optimizer_config(cfg["optimizer"])
    optim.check_scheduler_config(cfg["scheduler"])


def class_weights(cfg: dict) -> torch.Tensor:
    """The reference's loss weights: class frequency ** -0.125."""
    return torch.tensor([f ** -0.125 for f in cfg["train"]["class_frequencies"]], dtype=torch.float32)


def weighted_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Per-pixel weighted CE averaged over all pixels (reduction 'none' then mean, as upstream)."""
    return torch.nn.functional.cross_entropy(logits, labels, weight=weights, reduction="none").mean()


def predicted_classes(logits: torch.Tensor) -> torch.Tensor:
    """argmax over the class dimension of (N, C, H, W) logits, the first maximum on ties, as
    logits.argmax(1); taken over a channels-last copy because torch's CPU argmax over a
    strided dimension is slow: 127 ms against 16 ms for two 3 x 768 x 1152 samples
    (2-core AMD EPYC, torch 2.13), 2 % of a full-size training step and more of an eval."""
    return logits.permute(0, 2, 3, 1).contiguous().argmax(-1)


def iou_per_sample(pred: torch.Tensor, labels: torch.Tensor, n_classes: int) -> torch.Tensor:
    """Mean IoU over classes for each sample; a class absent from both counts as 1 (upstream)."""
    p, g = pred.reshape(pred.shape[0], -1), labels.reshape(labels.shape[0], -1)
    ious = []
    for c in range(n_classes):
        pc, gc = p == c, g == c
        tp = (pc & gc).sum(1).double()
        union = (pc | gc).sum(1).double()
        ious.append(torch.where(union > 0, tp / union.clamp(min=1), torch.ones_like(tp)))
    return torch.stack(ious, 1).mean(1)


# the reference's event order (mlcommons/hpc@2c627d4): init_start, then cache_clear
# (deepcam/src/deepCam/train.py:67-68); eval_accuracy, and target_accuracy_reached when
# reached, between eval_start and eval_stop (driver/validation.py:86-91)
LOG_STYLE = LogStyle(cache_clear_first=False, metric_at="eval", target_event="target_accuracy_reached")


def hyperparameters(cfg: dict, global_batch: int) -> list[tuple[str, object]]:
    return [
        (C.GLOBAL_BATCH_SIZE, global_batch),
        ("batchnorm_group_size", cfg["model"]["batchnorm_group_size"]),
        ("gradient_accumulation_frequency", cfg["train"]["gradient_accumulation_frequency"]),
        ("checkpoint", None),    # the kit does not resume; the reference logs its --checkpoint (train.py:101)
        *optim.mlperf_optimizer_keys(cfg["optimizer"], cfg["scheduler"]),
        (C.TRAIN_SAMPLES, cfg["data"]["n_train"]),     # after the optimizer's, as train.py:185-187
        (C.EVAL_SAMPLES, cfg["data"]["n_valid"]),
    ]


class Trainer:
    def __init__(self, cfg: dict, launched):
        torch.manual_seed(launched.seed)
        self.cfg, self.device, self.comm = cfg, launched.device, launched.comm
        self.memory_format = step.torch_memory_format(cfg, 2)
        self.model = build_model(cfg).to(self.device, memory_format=self.memory_format)
        # DDP averages gradients in backward (skipped with no_sync between accumulation
        # steps); Horovod broadcasts rank 0's state and averages before each step
        # batch-norm running statistics stay each rank's own during the epoch (DDP's
        # broadcast_buffers=False) and are averaged over the ranks after it, before
        # evaluation, as the reference (mlcommons/hpc@2c627d4 deepcam/src/deepCam/train.py:166-175
        # and :216-217, utils/bnstats.py:77-99: all-reduce sum / ranks of running_mean/var)
        self.net = (self.comm.wrap_model(self.model, broadcast_buffers=False)
                    if self.comm.kind in ("torch", "horovod") else self.model)
        self.bn_stats = [b for m in self.model.modules() for name in ("running_mean", "running_var")
                         if isinstance(b := getattr(m, name, None), torch.Tensor)]
        self.optimizer = optim.make_optimizer(self.model.parameters(), cfg["optimizer"])
        self.scheduler = optim.make_scheduler(self.optimizer, cfg["scheduler"])
        self.weights = class_weights(cfg).to(self.device)
        self.accumulate = cfg["train"]["gradient_accumulation_frequency"]
        params = list(self.model.parameters())
        self.step = step.TrainStep(
            params=params, optimizer=self.optimizer, forward=self._forward, device=self.device,
            precision_name=cfg["train"]["precision"], cuda_graph=cfg["train"]["cuda_graph"],
            no_sync=self.net.no_sync if self.comm.kind == "torch" else None,
            before_update=(lambda: self.comm.average_gradients(params)) if self.comm.kind == "horovod" else None)
        self.steps = 0                          # batches trained, the reference's step_num
        self.last_train = (float("nan"),) * 3   # (learning rate, loss, IoU) of the last epoch's end

    def _forward(self, x, y):
        """(loss as back-propagated: / gradient_accumulation_frequency, logits)."""
        with self.step.autocast():
            logits = self.net(x)
        return weighted_cross_entropy(logits.float(), y, self.weights) / self.accumulate, logits

    def to_device(self, x, y, device):
        return data.to_device(x, y, device, memory_format=self.memory_format)

    def train_epoch(self, batches) -> int:
        """One epoch; returns the samples trained. Keeps what the reference logs at the end
        of an epoch (mlcommons/hpc@2c627d4 deepcam/src/deepCam/driver/trainer.py:98-116, its
        default --logging_frequency 0): the learning rate of the last optimizer step, and
        the last batch's loss (as back-propagated: / gradient_accumulation_frequency) and
        mean IoU, in self.last_train for train.py to average over the ranks and log. Nothing
        is read back to the host before the epoch's end (common/step.py)."""
        self.model.train()
        n = 0
        lr = self.optimizer.param_groups[0]["lr"]
        logits = y = loss = None
        for i, (x, y) in enumerate(step.prefetched(batches, self.to_device, self.device), start=1):
            if self.accumulate == 1:
                lr = self.optimizer.param_groups[0]["lr"]
                loss, logits = self.step.step(x, y)
                self.scheduler.step()
            else:
                last = i % self.accumulate == 0
                if last:
                    lr = self.optimizer.param_groups[0]["lr"]
                loss, logits = self.step.accumulated(x, y, last)
                if last:
                    self.scheduler.step()
            n += x.shape[0]
            self.steps += 1
        self.step.check()   # a non-finite gradient in this epoch ends the run here, naming its step
        if loss is not None:
            iou = iou_per_sample(predicted_classes(logits.detach()), y, self.cfg["model"]["n_classes"]).mean().item()
            self.last_train = (lr, float(loss), iou)
        return n

    def average_bn_stats(self) -> None:
        self.comm.average_tensors(self.bn_stats)

    def bn_fingerprint(self) -> float:
        return float(sum(b.double().abs().sum().item() for b in self.bn_stats))

    def evaluate(self, batches) -> tuple[float, int, float, int]:
        """(sum of per-sample IoUs over this rank's samples, samples, sum of the batches'
        losses, batches): eval_loss is the mean batch loss over all ranks' batches, as the
        reference's (driver/validation.py:57-84). Summed on the device, read once."""
        self.model.eval()
        total = torch.zeros((), dtype=torch.float64, device=self.device)
        loss = torch.zeros((), dtype=torch.float64, device=self.device)
        n, batches_seen = 0, 0
        with torch.no_grad():
            for x, y in step.prefetched(batches, self.to_device, self.device):
                with self.step.autocast():
                    logits = self.model(x)
                loss += weighted_cross_entropy(logits.float(), y, self.weights).double()
                batches_seen += 1
                total += iou_per_sample(predicted_classes(logits), y, self.cfg["model"]["n_classes"]).sum()
                n += x.shape[0]
        return float(total), n, float(loss), batches_seen

    def fingerprint(self) -> float:
        """Weights and batch-norm statistics: both must be equal on every rank at the end."""
        return float(sum(p.detach().double().abs().sum().item() for p in self.model.parameters())) \
            + self.bn_fingerprint()


class DeepCAMParts(Parts):
    """DeepCAM's parts of the run (common/lifecycle.py): the stats file, the Trainer, the
    staged HDF5 shards and their loaders, the reference's end-of-epoch events."""

    descriptor, style = DESCRIPTOR, LOG_STYLE

    def __init__(self, cfg: dict, launched, global_batch: int, data_dir: str, files: dict, per_rank: int,
                 dropped: int, unit: int):
        super().__init__(cfg, launched, global_batch)
        self.data_dir, self.files, self.per_rank, self.dropped, self.unit = data_dir, files, per_rank, dropped, unit
        self.stats = data.load_stats(data_dir, cfg["data"]["n_channels"])

    def hyperparameters(self):
        return hyperparameters(self.cfg, self.global_batch)

    def input_files(self):
        return [p for split in self.files.values() for p in split.files]

    def build(self, run):
        self.trainer = Trainer(self.cfg, self.launched)

    def prepare(self, run):
        cfg, launched = self.cfg, self.launched
        self.reading = run.stage_and_shard(self.files, self.per_rank, self.dropped, self.unit, launched.stage_dir,
                                           cfg["data"]["shuffle"])
        self.loaders = {name: data.torch_loader(r.files, self.stats, cfg, name == "train", launched.seed, r.sampler,
                                                device=launched.device)
                        for name, r in self.reading.items()}

    def batches(self, name: str):
        split = self.reading[name].files
        return diagnosed(self.loaders[name], lambda: data.find_bad_file(split, self.stats, self.cfg),
                         str(split.files[0].parent))

    def train_epoch(self, epoch, run):
        trainer = self.trainer
        n = trainer.train_epoch(run.limited(self.batches("train")))
        n, *sums = self.comm.allreduce_sum([n, *trainer.last_train])
        # the reference's end-of-epoch events, rank means (trainer.py:114-116)
        for key, value in zip(("learning_rate", "train_accuracy", "train_loss"), sums):
            run.log.event(key, value / self.ranks.size, metadata={"epoch_num": epoch, "step_num": trainer.steps})
        trainer.average_bn_stats()
        return n

    def evaluate(self):
        total, n, loss, n_batches = self.comm.allreduce_sum(list(self.trainer.evaluate(self.batches("validation"))))
        return total / n, n, [("eval_loss", loss / max(n_batches, 1))]

    def fingerprint(self):
        return self.trainer.fingerprint()


def train(args) -> int:
    cfg = load_pytorch_config(args, BENCHMARK, "DeepCAM", validate_config)
    claim_output_dir(args.output_dir, getattr(args, "instances", 1))
    launched = launch(args, "pytorch", cfg)
    ranks, comm = launched.ranks, launched.comm
    step.resolve_options(cfg, launched.device, comm.kind == "none", cfg["optimizer"]["name"])
    if launched.seed <= 0:
        raise KitError(f"--seed {launched.seed}: the DeepCAM closed rules want a seed > 0")
    accumulate = cfg["train"]["gradient_accumulation_frequency"]
    global_batch = cfg["data"]["batch_size"] * ranks.size * accumulate
    files = data.find_dataset(args.data, cfg["data"]["n_train"], cfg["data"]["n_valid"])
    unit = cfg["data"]["batch_size"] * accumulate   # samples of one optimizer step on one rank
    files["train"], per_rank, dropped = equal_train_split(files["train"], ranks, unit)
    return lifecycle.train(DeepCAMParts(cfg, launched, global_batch, args.data, files, per_rank, dropped, unit),
                           args.output_dir)
