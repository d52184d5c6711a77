"""CosmoFlow training: schedule, the two framework back ends, and the run from data to verdict.

Reads top to bottom: config -> dataset files -> cache clear -> init (model, optimizer)
-> run_start -> staging -> loaders -> epochs (train, evaluate) -> run_stop.
The run's lifecycle lives in hpckit.common.lifecycle, its protocol in hpckit.common.run.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from hpckit.common import cores, dist, lifecycle, precision
from hpckit.common.config import check_auto_or_count, load_config, require
from hpckit.common.errors import KitError
from hpckit.common.lifecycle import Parts
from hpckit.common.mllog import HPC, C
from hpckit.common.native_log import divert_native_stderr
from hpckit.common.fileio import ensure_writable_dir
from hpckit.common.run import (LogStyle, StageAs, check_finite, claim_output_dir, diagnosed, equal_train_split,
                               launch)
from hpckit.cosmoflow import BENCHMARK, DESCRIPTOR, data
from hpckit.cosmoflow.model_spec import validate_model_config


# ---------------------------------------------------------------- config and schedule

def validate_config(cfg: dict) -> None:
    d, lr, t = cfg["data"], cfg["lr_schedule"], cfg["train"]
    for key in ("sample_size", "n_train", "n_valid", "batch_size", "prefetch"):
        require(d[key] >= 1, f"data.{key}", f"must be >= 1 (got {d[key]})")
    check_auto_or_count(d["loader_workers"], "data.loader_workers")
    require(isinstance(d["stage_decode"], bool), "data.stage_decode", f"must be true or false (got {d['stage_decode']!r})")
    require(cfg["optimizer"]["name"].lower() == "sgd", "optimizer.name", "CosmoFlow closed division uses sgd")
    require(0.0 <= cfg["optimizer"]["momentum"] < 1.0, "optimizer.momentum", "must be in [0, 1)")
    require(lr["base_lr"] >= 0.0, "lr_schedule.base_lr", f"must be >= 0 (got {lr['base_lr']})")
    require(lr["base_batch_size"] >= 1, "lr_schedule.base_batch_size", "must be >= 1")
    require(lr["scaling"] in ("linear", "sqrt", "none"), "lr_schedule.scaling", "must be linear, sqrt or none")
    require(lr["n_warmup_epochs"] >= 0, "lr_schedule.n_warmup_epochs", "must be >= 0")
    for epoch, factor in lr["decay_schedule"].items():
        require(isinstance(epoch, int) and epoch >= 0, "lr_schedule.decay_schedule", f"epoch {epoch!r} is not an integer")
        require(isinstance(factor, (int, float)) and factor > 0, "lr_schedule.decay_schedule",
                f"factor for epoch {epoch} must be > 0")
    require(t["n_epochs"] >= 1, "train.n_epochs", "must be >= 1")
    require(0.0 < t["target_mae"], "train.target_mae", "must be > 0")
    validate_model_config(cfg)


def peak_lr(cfg: dict, global_batch: int) -> tuple[float, float]:
    """(peak learning rate, scale factor) for the global batch, as the reference scales."""
    lr = cfg["lr_schedule"]
    ratio = global_batch / lr["base_batch_size"]
    factor = {"linear": ratio, "sqrt": math.sqrt(ratio), "none": 1.0}[lr["scaling"]]
    return lr["base_lr"] * factor, factor


def learning_rate(cfg: dict, global_batch: int, epoch_index: int) -> float:
    """LR of 0-based epoch `epoch_index`: linear warmup base -> peak, then the latest decay."""
    lr = cfg["lr_schedule"]
    base, (peak, _) = lr["base_lr"], peak_lr(cfg, global_batch)
    warm = lr["n_warmup_epochs"]
    if epoch_index < warm:
        return base + epoch_index * (peak - base) / warm
    factor, since = 1.0, -1
    for boundary, f in lr["decay_schedule"].items():
        if since <= boundary < epoch_index:
            since, factor = boundary, f
    return peak * factor


# the reference's event order (mlcommons/hpc@2c627d4): cache_clear, then init_start
# (cosmoflow/train.py:242-243); eval_error after epoch_stop (utils/callbacks.py:58-69)
LOG_STYLE = LogStyle(cache_clear_first=True, metric_at="after_epoch")


def hyperparameters(cfg: dict, global_batch: int) -> list[tuple[str, object]]:
    peak, factor = peak_lr(cfg, global_batch)
    decay = cfg["lr_schedule"]["decay_schedule"]
    return [
        (C.OPT_WEIGHT_DECAY, cfg["model"]["l2"]),
        (HPC.DROPOUT, cfg["model"]["dropout"]),
        (C.GLOBAL_BATCH_SIZE, global_batch),
        (C.TRAIN_SAMPLES, cfg["data"]["n_train"]),
        (C.EVAL_SAMPLES, cfg["data"]["n_valid"]),
        (C.OPT_BASE_LR, peak),
        (C.OPT_LR_WARMUP_EPOCHS, cfg["lr_schedule"]["n_warmup_epochs"]),
        (C.OPT_LR_WARMUP_FACTOR, factor),
        (C.OPT_LR_DECAY_BOUNDARY_EPOCHS, sorted(decay)),
        (C.OPT_LR_DECAY_FACTOR, [decay[k] for k in sorted(decay)]),
        (C.OPT_NAME, "sgd"),
    ]


# ---------------------------------------------------------------- PyTorch back end

class TorchBackend:
    name = "pytorch"

    def __init__(self, cfg: dict, launched, out_dir: Path):
        import torch
        from hpckit.common import step
        from hpckit.cosmoflow.model_torch import CosmoFlow
        from hpckit.cosmoflow.optim_torch import KerasSGD
        torch.manual_seed(launched.seed)
        self.torch, self.cfg, self.seed = torch, cfg, launched.seed
        self.device, self.comm = launched.device, launched.comm
        self.model = CosmoFlow(cfg).to(self.device, memory_format=step.torch_memory_format(cfg, 3))
        self.params = [p for p in self.model.parameters()]
        self.optimizer = KerasSGD(self.params, lr=0.0, momentum=cfg["optimizer"]["momentum"])
        # DDP wraps the module (gradients averaged in backward); Horovod broadcasts rank 0's
        # weights and averages after backward; one process: the module itself
        self.net = self.comm.wrap_model(self.model) if self.comm.kind in ("torch", "horovod") else self.model
        self.step = step.TrainStep(
            params=self.params, optimizer=self.optimizer, forward=self._forward, device=self.device,
            precision_name=cfg["train"]["precision"], cuda_graph=cfg["train"]["cuda_graph"],
            before_update=(lambda: self.comm.average_gradients(self.params)) if self.comm.kind == "horovod" else None)
        self.prefetched = step.prefetched
        self.steps = 0

    def _forward(self, x, y):
        with self.step.autocast():
            pred = self.net(x)
        return self.torch.mean((pred.float() - y) ** 2) + self.model.l2_penalty(), None

    def loaders(self, splits):
        return (data.torch_loader(splits["train"].files, self.cfg, True, self.seed, splits["train"].sampler,
                                  device=self.device),
                data.torch_loader(splits["validation"].files, self.cfg, False, self.seed,
                                  splits["validation"].sampler, device=self.device))

    def train_epoch(self, loader, split, lr: float) -> int:
        """One epoch at learning rate `lr`; nothing read back to the host before its end
        (common/step.py: a non-finite gradient ends the run there, naming its step)."""
        self.model.train()
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        n = 0
        for x, y in self.prefetched(_diagnosed(loader, split, self.cfg), data.to_device, self.device):
            self.step.step(x, y)
            n += x.shape[0]
            self.steps += 1
        self.step.check()
        return n

    def evaluate(self, loader, split) -> tuple[float, int]:
        """(sum of absolute errors over this rank's samples and targets, samples); summed
        on the device, read once."""
        torch = self.torch
        self.model.eval()
        total, n = torch.zeros((), dtype=torch.float64, device=self.device), 0
        with torch.no_grad():
            for x, y in self.prefetched(_diagnosed(loader, split, self.cfg), data.to_device, self.device):
                with self.step.autocast():
                    pred = self.model(x)
                total += torch.abs(pred.float() - y).sum().double()
                n += x.shape[0]
        return float(total), n

    def fingerprint(self) -> float:
        return float(sum(p.detach().double().abs().sum().item() for p in self.params))


# ---------------------------------------------------------------- TensorFlow back end

class TensorFlowBackend:
    name = "tensorflow"

    def __init__(self, cfg: dict, launched, out_dir: Path):
        import keras
        import tensorflow as tf
        from hpckit.cosmoflow.model_tf import build_model
        keras.utils.set_random_seed(launched.seed)
        precision.keras_policy(cfg["train"]["precision"])   # before the model is built
        self.tf, self.cfg, self.seed = tf, cfg, launched.seed
        # --dist tf: variables mirrored on every worker, gradients all-reduced (SUM) by the
        # optimizer in replica context; one process: the default strategy
        self.strategy = launched.comm.strategy if launched.comm.kind == "tf" else tf.distribute.get_strategy()
        replicas = self.strategy.num_replicas_in_sync
        with self.strategy.scope():
            self.model = build_model(cfg)
            self.optimizer = keras.optimizers.SGD(learning_rate=0.0, momentum=cfg["optimizer"]["momentum"])
        model, optimizer, strategy = self.model, self.optimizer, self.strategy

        def replica_train_step(x, y):
            with tf.GradientTape() as tape:
                # each replica's mean over its local batch / replicas: summed = global mean
                pred = tf.cast(model(x, training=True), tf.float32)   # bf16 under mixed precision
                loss = tf.reduce_mean(tf.square(pred - y))
                if model.losses:
                    loss += tf.add_n(model.losses)
                loss = loss / replicas
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            # the updated weights are the same on every replica: all stop at the same step
            # when they turn non-finite
            return tf.shape(x)[0], tf.linalg.global_norm(model.trainable_variables)

        # traced as written, no AutoGraph: nothing here branches or loops on a tensor
        # (cosmoflow/data.py, TensorFlow)
        @tf.function(autograph=False)
        def train_step(x, y):
            n, norm = strategy.run(replica_train_step, args=(x, y))
            return strategy.experimental_local_results(n)[0], strategy.experimental_local_results(norm)[0]

        @tf.function(autograph=False)
        def eval_step(x, y):
            pred = tf.cast(model(x, training=False), tf.float32)
            return tf.reduce_sum(tf.abs(pred - y)), tf.shape(x)[0]

        self.train_step, self.eval_step = train_step, eval_step
        self.steps = 0

    def loaders(self, splits):
        return (data.tf_dataset(splits["train"].files, self.cfg, True, self.seed, splits["train"].sampler),
                data.tf_dataset(splits["validation"].files, self.cfg, False, self.seed,
                                splits["validation"].sampler))

    def train_epoch(self, ds, split, lr: float) -> int:
        self.optimizer.learning_rate.assign(lr)
        n = 0
        for x, y in _diagnosed(ds, split, self.cfg):
            k, norm = self.train_step(x, y)
            n += int(k)
            self.steps += 1
            check_finite(float(norm), self.steps, "the weights' norm")
        return n

    def evaluate(self, ds, split) -> tuple[float, int]:
        """(sum of absolute errors over this rank's samples and targets, samples)."""
        total, n = 0.0, 0
        for x, y in _diagnosed(ds, split, self.cfg):
            s, k = self.eval_step(x, y)
            total, n = total + float(s), n + int(k)
        return total, n

    def fingerprint(self) -> float:
        import numpy as np
        return float(sum(np.abs(v.numpy().astype(np.float64)).sum() for v in self.model.trainable_variables))


BACKENDS = {"pytorch": TorchBackend, "tensorflow": TensorFlowBackend}


def _diagnosed(batches, split: data.SplitFiles, cfg: dict):
    return diagnosed(batches, lambda: data.find_bad_file(split, cfg["data"]["sample_size"]),
                     f"{split.files[0].parent}")


# ---------------------------------------------------------------- the run

def choose_framework(requested: str, device: str = "auto") -> str:
    """`--framework auto` (the default): the CosmoFlow path for this machine, from
    bench/side_by_side.py (docs/performance.md): TensorFlow on x86 AVX-512 servers
    (cores.cpu_class x86-avx512*: F+CD+BW+DQ+VL; as fast as PyTorch with tcmalloc, 1.96 s a
    full-size step both, and 2.9x faster where tcmalloc is missing: its own allocator),
    PyTorch elsewhere: AVX2-only x86 (2.4x the reference's TensorFlow on an AVX2-only EPYC),
    Knights Landing (avx512f without BW/VL/DQ: oneDNN 3.x runs its AVX2 kernels there,
    cores.onednn_isa), Arm (unmeasured) and GPUs (the kit's GPU path: CUDA, NCCL). The chosen
    framework is logged (hpckit_config.framework)."""
    if requested != "auto":
        return requested
    gpu = device == "cuda" or (device == "auto" and Path("/proc/driver/nvidia/gpus").is_dir()
                               and os.environ.get("CUDA_VISIBLE_DEVICES", "x") != "")
    if gpu:
        return "pytorch"
    return "tensorflow" if cores.cpu_class() in ("x86-avx512", "x86-avx512-bf16") else "pytorch"


class CosmoFlowParts(Parts):
    """CosmoFlow's parts of the run (common/lifecycle.py): the framework's back end, the
    samples staged (as copies, or decoded once with data.stage_decode) and their loaders."""

    descriptor, style = DESCRIPTOR, LOG_STYLE

    def __init__(self, cfg: dict, launched, global_batch: int, framework: str, files: dict, per_rank: int,
                 dropped: int):
        super().__init__(cfg, launched, global_batch)
        self.framework, self.files, self.per_rank, self.dropped = framework, files, per_rank, dropped

    def hyperparameters(self):
        return hyperparameters(self.cfg, self.global_batch)

    def input_files(self):
        return [p for split in self.files.values() for p in split.all_paths()]

    def build(self, run):
        self.backend = BACKENDS[self.framework](self.cfg, self.launched, run.out_dir)

    def prepare(self, run):
        cfg = self.cfg
        stage_as = None
        if cfg["data"]["stage_decode"] and self.files["train"].fmt == "tfrecord":
            # decoded once at staging, read as npy every epoch (a named deviation: the
            # reference stages copies; docs/differences-from-reference.md)
            size = cfg["data"]["sample_size"]
            stage_as = StageAs(write=lambda split, dest: data.decode_into(split, dest, size), relocate=data.decoded,
                               written_as="decoded")
        self.reading = run.stage_and_shard(self.files, self.per_rank, self.dropped, cfg["data"]["batch_size"],
                                           self.launched.stage_dir, cfg["data"]["shuffle"], stage_as)
        self.train_data, self.valid_data = self.backend.loaders(self.reading)

    def train_epoch(self, epoch, run):
        lr = learning_rate(self.cfg, self.global_batch, epoch - 1)
        n = self.backend.train_epoch(run.limited(self.train_data), self.reading["train"].files, lr)
        return self.comm.allreduce_sum([n])[0]

    def evaluate(self):
        total, n = self.comm.allreduce_sum(list(self.backend.evaluate(self.valid_data,
                                                                      self.reading["validation"].files)))
        return total / (n * data.N_TARGETS), n

    def fingerprint(self):
        return self.backend.fingerprint()


def train(args) -> int:
    cfg = load_config(BENCHMARK, args.config, args.overrides)
    validate_config(cfg)
    claim_output_dir(args.output_dir, getattr(args, "instances", 1))
    args.framework = choose_framework(args.framework, args.device)
    if args.framework == "tensorflow":
        # before TensorFlow (or tf.distribute) is first imported: its C++ log lines go to a file
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        # TensorFlow turns its oneDNN kernels on by default only on CPUs with AVX512_VNNI,
        # AVX512_BF16 or AMX (TF 2.9 release notes); elsewhere (AVX2-only x86: Zen 3, KNL's
        # AVX2 plan) its Eigen convolutions ran the mini CosmoFlow 2.6x slower (255 s against
        # 97 s to the target on a 2-core EPYC, bench: docs/performance.md). The kit runs the
        # same oneDNN kernels on every x86 CPU unless the environment says otherwise; the run
        # records which (summary.json software.tensorflow_onednn_opts).
        os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
        rank = dist.detect().rank
        divert_native_stderr(ensure_writable_dir(args.output_dir, "--output-dir")
                             / ("tensorflow-native.log" if rank == 0 else f"tensorflow-native.rank{rank}.log"))
    launched = launch(args, args.framework, cfg)
    ranks, comm = launched.ranks, launched.comm
    if args.framework == "pytorch":
        from hpckit.common import step
        step.resolve_options(cfg, launched.device, comm.kind == "none", cfg["optimizer"]["name"])
    else:   # TensorFlow: Keras' channels_last layers (NDHWC) and its own graph (tf.function)
        for key, fixed in (("memory_format", "channels_last"), ("cuda_graph", False)):
            if str(cfg["train"][key]).lower() not in ("auto", str(fixed).lower()):
                raise KitError(f"config key 'train.{key}': {cfg['train'][key]!r} is for the PyTorch back end; "
                               f"the TensorFlow CosmoFlow runs {fixed} (use auto)")
            cfg["train"][key] = fixed
    global_batch = cfg["data"]["batch_size"] * ranks.size
    if cfg["data"]["n_valid"] % ranks.size:
        raise KitError(f"config key 'data.n_valid': {cfg['data']['n_valid']} is not divisible by "
                       f"{ranks.size} ranks")
    files = data.find_dataset(args.data, cfg["data"]["n_train"], cfg["data"]["n_valid"])
    # the reference refuses a sample count not divisible by the global batch
    # (mlcommons/hpc@2c627d4 cosmoflow/data/cosmo.py:95-99); the kit drops the remainder
    # instead, as DeepCAM's reference does, and logs it (hpckit_train_share)
    files["train"], per_rank, dropped = equal_train_split(files["train"], ranks, cfg["data"]["batch_size"])
    return lifecycle.train(CosmoFlowParts(cfg, launched, global_batch, args.framework, files, per_rank, dropped),
                           args.output_dir)

