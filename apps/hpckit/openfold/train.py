"""OpenFold training: the MLPerf reference's run, from the processed data to the verdict.

Reads top to bottom: config -> the data root and the checkpoint checked -> init (model, Adam,
the lr schedule, the checkpoint's parameters, the weight average; every hyperparameter the
closed rules require) -> run_start -> staging -> the training and validation sets from the
records -> train/eval cycles (val_every_iters training iterations, then avg lDDT-Ca of the
averaged weights on the CAMEO set) -> run_stop. The run's lifecycle lives in
hpckit.common.lifecycle, its protocol in hpckit.common.run.

As the reference's train.py (mlcommons/hpc@2c627d4 openfold/train.py; `file:line` below is in
hpc@2c627d4 openfold/, its package's files under openfold/openfold/):
  * the model built under torch.manual_seed(seed_from_string("alphafold_init_<seed>")), the
    global generators restored after (train.py:287-302, 482-487);
  * Adam(base_lr, betas (0.9, 0.999), eps 1e-6, weight decay 0, amsgrad off) (train.py:526-536,
    config.py:342-346); the lr of OpenFoldBenchmarkLRScheduler set at every optimizer step:
    linear from warmup_lr_init to base_lr over warmup_lr_iters iterations (float64 linspace,
    rounded to 10 places), then base_lr (lr_scheduler.py:81-118; train.py:565-574, 782);
  * --checkpoint is --initialize_parameters_from (train.py:305-344, 576-585): the file's bytes
    hashed (sha256, logged as init_checkpoint_sha256sum), loaded (here with
    torch.load(weights_only=True): tensors and containers only, nothing unpickled that could
    run code), a plain state_dict or a resumable checkpoint {alphafold_state_dict,
    optimizer_state_dict}, whose optimizer state is loaded too; strict parameter names;
  * the weight average for evaluation: AveragedModel with avg + (p - avg) x (1 - decay),
    decay 0.9, updated after every optimizer step (swa.py:21-70, train.py:587-594, 787-789,
    config.py:353-354);
  * sampling: InitialTrainingSampler's (index, seed) pairs, num_train_iters x global batch
    drawn by the sampling weights, every world_size-th to a rank (records.training_index_seed_pairs,
    samplers.py:28-78, train.py:672-682); each sample made by make_example with its seed
    (datasets.py:78-139), batches collated, drop_last, and the recycling iterations of each
    optimizer step drawn by TrainBatchProperties (transforms.RecyclingSchedule, dataloaders.py:28-62,
    213-262);
  * each training iteration: torch.manual_seed(seed_from_string("forward_<seed>_<rank>_<iteration>"))
    (rank None without torch.distributed, as the reference's single-process run), the forward,
    AlphaFoldLoss on the last recycling iteration, divided by gradient_accumulation_iters;
    zero_grad at the first iteration of an accumulation, then at its last: clip_grad_norm_ to
    0.1, the lr, optimizer.step, the average's update (train.py:728-789);
  * every val_every_iters iterations (40) a train/eval cycle ends: epoch_stop, then eval_start,
    the averaged model in eval mode on the CAMEO validation set (ValidationSampler's order and
    seeds, one sample a batch, every recycling iteration), lDDT-Ca of final_atom_positions per
    target, their plain mean logged as eval_accuracy, eval_stop; the run stops at
    target_avg_lddt_ca_value (train.py:846-950, 347-380). Ranks evaluate every world_size-th
    target (padded as the reference's sampler pads) and the per-target values are summed
    across ranks, each target counted once (dist_gather_val_metrics);
  * the log (train.py:437-718): every key closed_openfold.yaml requires, with the reference's
    values and in its order (hyperparameters below); train_samples and eval_samples after
    run_start, where the reference builds its datasets.

"Epochs": the reference has none. Its log's epoch_num is the number of training samples seen
by the end of the train/eval cycle (cycle x global batch x val_every_iters, train.py:730-734),
on epoch_start, epoch_stop, eval_start, eval_accuracy and eval_stop alike: so is the kit's.
summary.json's `epochs` counts the cycles.

Measured at the reference's size on a CPU (2-core AMD EPYC, 23 GiB, torch 2.13; other
sessions' tests on the same cores for part of it, CPU wait share 0.34): `hpckit train openfold
--config reference --set train.max_steps=1` on `hpckit datagen openfold` chains of 256 residues
(2 training, 1 validation): init 39 s (with the FLOP count on the meta device: 46.7 TFLOP for
one recycling iteration's forward and backward), the one training step 2,369 s (39.5 min; its
recycling draw for --seed 1 is 3, so four forwards, the last with autograd and gradient
checkpointing), the evaluation of the one 256-residue target 545 s (four forwards), 49 min in
all; peak RSS 13.7 GiB (VmHWM), 14.3 GB at most as /usr/bin/time saw it. Exit 3, step-limited.

Differences from the reference (one line each):
  * run_stop is aborted when the iterations run out below the target (the reference logs
    success whatever the accuracy, train.py:957), as every kit benchmark;
  * num_train_iters must be a whole number of cycles (a last partial cycle of the reference
    trains without an evaluation and logs no epoch_stop);
  * without --checkpoint the kit logs init_checkpoint_sha256sum as the sha256 of no bytes
    (e3b0c442...), where the reference logs no such line: either way the official rules fail a run
    that did not start from the official checkpoint (a wrong value, or a missing key);
  * precision: fp32 only; the reference's default is tf32 on its GPUs (train.py:121-126, 466-474),
    logged as such; the kit logs fp32;
  * InitialTrainingDataloaderPQ (the non-deterministic priority queue) is not offered: the
    PyTorch DataLoader's deterministic order (InitialTrainingDataloaderPT, the reference's default);
  * the validation set is read with the training loader's worker count capped at 2 (the
    reference's --num_val_dataloader_workers 2);
  * staging: --stage-dir copies the whole data set to node-local storage inside the clock (every
    rank samples from all chains); the reference stages nothing (train.py:616-634);
  * a non-finite gradient norm stops the run as diverged (exit 3), as in every kit benchmark;
  * no per-iteration training log files, no checkpoints written (train.py:807-946).
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import stat
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from hpckit.common.config import check_auto_or_count, load_pytorch_config, require
from hpckit.common import lifecycle
from hpckit.common.errors import KitError
from hpckit.common.lifecycle import Parts
from hpckit.common.mllog import C
from hpckit.common.run import LogStyle, check_finite, claim_output_dir, launch
from hpckit.common.staging import copy_files
from hpckit.openfold import BENCHMARK, DESCRIPTOR, records
from hpckit.openfold import loss as L
from hpckit.openfold import model as M
from hpckit.openfold import transforms as TR

# the reference's event order (train.py:437-438, 846-927): cache_clear right after init_start;
# epoch_stop before eval_start; eval_accuracy between eval_start and eval_stop
LOG_STYLE = LogStyle(cache_clear_first=False, metric_at="eval", eval_in_epoch=False,
                     epoch_unit="train/eval cycles")
DATALOADER_TYPES = ("InitialTrainingDataloaderPT",)   # train.py:209-220 (PQ: not offered)
NO_CHECKPOINT_SHA256 = hashlib.sha256(b"").hexdigest()
CHECKPOINT_LIMIT = 8 << 30          # never more (the reference's resumable checkpoint is 1.1 GiB, README.md:101)
CHECKPOINT_SLACK = 64 << 20         # checkpoint_limit: the pickle and zip around the tensors
EVAL_WORKERS = 2                    # --num_val_dataloader_workers 2 (README.md:152)
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
_SHA256 = re.compile(r"[0-9a-f]{64}")


# ------------------------------------------------------------------ the config

def _int(value, low: int, high: int | None = None) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low and (high is None or value <= high)


# Upper bounds of the run's counts (docs/security.md "Bounds"; the data pipeline's are
# transforms.DATA_BOUNDS, the model's widths model.MAX_WIDTH and MAX_BLOCKS): what the
# reference's data and runs use, generously, and finite (each of these was a loop or an
# allocation of its size before the first sample).
MAX_SAMPLES = 1 << 20         # data.n_train, n_valid: the reference selects 594,595 and 180
MAX_LOCAL_BATCH = 256         # data.batch_size: the reference's runs take 1 a rank
MAX_LOADER_WORKERS = 256      # data.loader_workers: the reference's 14 a rank
MAX_TRAIN_ITERS = 1 << 20     # train.num_train_iters: the reference's 2,000 (warm-up and cycles within them)
MAX_TRAIN_SAMPLES = 1 << 26   # num_train_iters x global batch drawn by the sampler: 2,000 x 2,048 = 4.1 M at most


def _number(value, low: float) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= low


def validate_config(cfg: dict) -> None:
    d, o, s, t = cfg["data"], cfg["optimizer"], cfg["swa"], cfg["train"]
    for key, high in (("n_train", MAX_SAMPLES), ("n_valid", MAX_SAMPLES), ("batch_size", MAX_LOCAL_BATCH)):
        require(_int(d[key], 1, high), f"data.{key}", f"must be an integer in 1..{high} (got {d[key]!r:.40})")
    check_auto_or_count(d["loader_workers"], "data.loader_workers")
    require(d["loader_workers"] == "auto" or d["loader_workers"] <= MAX_LOADER_WORKERS, "data.loader_workers",
            f"must be auto or a count 0..{MAX_LOADER_WORKERS} (got {d['loader_workers']!r:.40})")
    TR.data_config(cfg)   # the pipeline's keys, each checked (a bad one names itself)
    require(o["name"] == "Adam", "optimizer.name", f"the reference trains with Adam (got {o['name']!r})")
    for key in ("base_lr", "warmup_lr_init", "weight_decay"):
        require(_number(o[key], 0.0), f"optimizer.{key}", f"must be a number >= 0 (got {o[key]!r})")
    require(_int(o["warmup_lr_iters"], 0), "optimizer.warmup_lr_iters", f"must be an integer >= 0 (got "
            f"{o['warmup_lr_iters']!r})")
    betas = o["betas"]
    require(isinstance(betas, list) and len(betas) == 2 and all(_number(b, 0.0) and b < 1 for b in betas),
            "optimizer.betas", f"must be two numbers in [0, 1) (got {betas!r})")
    require(_number(o["eps"], 0.0) and o["eps"] > 0, "optimizer.eps", f"must be > 0 (got {o['eps']!r})")
    for key in ("amsgrad", "gradient_clipping"):
        require(isinstance(o[key], bool), f"optimizer.{key}", f"must be true or false (got {o[key]!r})")
    require(_number(o["clip_grad_max_norm"], 0.0) and o["clip_grad_max_norm"] > 0, "optimizer.clip_grad_max_norm",
            f"must be > 0 (got {o['clip_grad_max_norm']!r})")
    require(isinstance(s["enabled"], bool), "swa.enabled", f"must be true or false (got {s['enabled']!r})")
    require(_number(s["decay_rate"], 0.0) and s["decay_rate"] <= 1, "swa.decay_rate",
            f"must be in [0, 1] (got {s['decay_rate']!r})")
    require(t["precision"] == "fp32", "train.precision",
            f"OpenFold trains in fp32 (the reference refuses bf16, fp16 and amp, train.py:470-471); got "
            f"{t['precision']!r}")
    for key, high in (("num_train_iters", MAX_TRAIN_ITERS), ("val_every_iters", MAX_TRAIN_ITERS),
                      ("gradient_accumulation_iters", MAX_TRAIN_ITERS),
                      ("val_max_sequence_length", records.MAX_CHAIN_RESIDUES)):
        require(_int(t[key], 1, high), f"train.{key}", f"must be an integer in 1..{high} (got {t[key]!r:.40})")
    # the warm-up's learning rates are made at init (a float64 linspace of warmup_lr_iters): beyond the
    # run's iterations none is ever used
    require(o["warmup_lr_iters"] <= t["num_train_iters"], "optimizer.warmup_lr_iters",
            f"must be at most train.num_train_iters ({t['num_train_iters']}): a warm-up past the run's end is never "
            f"reached (got {o['warmup_lr_iters']})")
    accumulation = t["gradient_accumulation_iters"]
    for key, value in (("train.num_train_iters", t["num_train_iters"]), ("train.val_every_iters", t["val_every_iters"]),
                       ("optimizer.warmup_lr_iters", o["warmup_lr_iters"])):   # train.py:277-283
        require(value % accumulation == 0, key, f"must be a multiple of train.gradient_accumulation_iters "
                f"({accumulation}), as the reference asserts (got {value})")
    require(t["num_train_iters"] % t["val_every_iters"] == 0, "train.num_train_iters",
            f"must be a whole number of train/eval cycles of train.val_every_iters ({t['val_every_iters']}) "
            f"iterations (got {t['num_train_iters']})")
    require(_number(t["target_avg_lddt_ca"], 0.0) and 0 < t["target_avg_lddt_ca"] <= 1, "train.target_avg_lddt_ca",
            f"must be an average lDDT-Ca in (0, 1] (got {t['target_avg_lddt_ca']!r})")
    for key in ("train_max_pdb_release_date", "val_min_cameo_submission_date", "val_max_cameo_submission_date"):
        require(isinstance(t[key], str) and _DATE.fullmatch(t[key]) is not None, f"train.{key}",
                f"must be a date YYYY-MM-DD in quotes (got {t[key]!r})")
    require(isinstance(t["filter_by_alignments"], bool), "train.filter_by_alignments", "must be true or false")
    require(t["dataloader_type"] in DATALOADER_TYPES, "train.dataloader_type",
            f"must be one of {', '.join(DATALOADER_TYPES)} (got {t['dataloader_type']!r})")
    require(isinstance(t["init_checkpoint_sha256"], str) and _SHA256.fullmatch(t["init_checkpoint_sha256"]) is not None,
            "train.init_checkpoint_sha256", "must be a sha256 digest, 64 lower-case hex digits")
    M.validate_model_config(cfg)
    require(_int(t["model_parameters_count"], 1), "train.model_parameters_count", "must be an integer >= 1")
    count = M.parameter_count(cfg)
    require(count == t["model_parameters_count"], "train.model_parameters_count",
            f"the model of this config has {count} parameters, the key says {t['model_parameters_count']} "
            "(the count the log carries and the rules check)")


# ------------------------------------------------------------------ the checkpoint

def _load_error(e: Exception) -> str:
    """The line of torch.load's message that says what is wrong (its first lines are advice)."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    advice = ("Weights only load failed", "Please file an issue", "Check the documentation")
    useful = [line for line in lines if not line.startswith(advice)] or lines or [type(e).__name__]
    return useful[0][:200]


@dataclass
class Checkpoint:
    path: Path
    sha256: str
    model_state: dict
    optimizer_state: dict | None


def checkpoint_limit(n_params: int) -> int:
    """The most bytes a --checkpoint of a model of `n_params` parameters is read to: the
    reference's resumable checkpoint holds the parameters and Adam's two moments in float32
    (93.2 M parameters: 1.1 GiB, README.md:101); allowed are four tensors a parameter (the
    parameters, exp_avg, exp_avg_sq, amsgrad's max_exp_avg_sq) of up to 8 bytes an element,
    and CHECKPOINT_SLACK for the pickle and the zip around them; never more than CHECKPOINT_LIMIT."""
    return min(CHECKPOINT_LIMIT, 4 * 8 * n_params + CHECKPOINT_SLACK)


def _load_once(path: str, what: str, limit: int) -> tuple[str, object]:
    """(sha256 of the file's bytes, torch.load(weights_only=True) of them), the file held in
    memory once: one descriptor, its bytes hashed in 8 MiB pieces, then read by torch.load from
    the same descriptor (the tensors are the one copy; before, the file's bytes were a second).
    A file that changes meanwhile (its size, mtime or ctime: ctime changes with any write, and
    no user can set it back) is refused, so the digest logged is of the bytes loaded."""
    from hpckit.common.inputs import _strerror
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except (OSError, ValueError) as e:
        raise KitError(f"{what}: cannot read ({_strerror(e)})") from None
    with open(fd, "rb", buffering=1 << 20) as f:
        try:
            before = os.fstat(fd)
            if stat.S_ISDIR(before.st_mode):
                raise KitError(f"{what}: is a directory, not a file")
            if not stat.S_ISREG(before.st_mode):
                raise KitError(f"{what}: not a regular file (a FIFO, socket or device is never read)")
            if before.st_size > limit:
                raise KitError(f"{what}: {before.st_size} bytes, more than the {limit} a checkpoint of the config's "
                               "model is read to (four float64 tensors a parameter, and 64 MiB)")
            digest, n = hashlib.sha256(), 0
            while chunk := f.read(8 << 20):
                digest.update(chunk)
                n += len(chunk)
            _check_checkpoint_pickle(f, what)
            f.seek(0)
        except OSError as e:
            raise KitError(f"{what}: cannot read ({_strerror(e)})") from None
        try:
            loaded = torch.load(f, map_location="cpu", weights_only=True)
        except Exception as e:   # not a zip, a pickle naming a global weights_only refuses, cut short ...
            raise KitError(f"{what}: not a PyTorch checkpoint that torch.load reads with weights_only=True "
                           f"({_load_error(e)})") from None
        after = os.fstat(fd)
    if n != before.st_size or (after.st_size, after.st_mtime_ns, after.st_ctime_ns) != (
            before.st_size, before.st_mtime_ns, before.st_ctime_ns):
        raise KitError(f"{what}: changed while it was read (its sha256 would not be of the bytes loaded)")
    return digest.hexdigest(), loaded


def _check_checkpoint_pickle(f, what: str) -> None:
    """The pickle of a torch.save zip (its first record's folder's data.pkl, the record
    torch.load unpickles), bounded before torch.load builds it (records.check_pickle_shape):
    torch's weights-only unpickler hashes every dict key it sets, and a key nested a million
    deep crashed it (SIGSEGV), one doubled through the memo hung it. At most CHECKPOINT_SLACK
    bytes (the reference's is about a MB: the tensors' data are records of their own). A file
    that is not such a zip (torch's legacy format) is refused: torch.save writes zips since
    torch 1.6, and the reference's checkpoint is one."""
    import zipfile
    try:
        f.seek(0)
        with zipfile.ZipFile(f) as z:
            infos = z.infolist()
            first = infos[0].filename if infos else ""
            name = f"{first.split('/', 1)[0]}/data.pkl"
            info = next((i for i in infos if i.filename == name), None)
            if "/" not in first or info is None:
                raise KitError(f"{what}: not a PyTorch checkpoint: a zip without {name} (torch.save's layout)")
            if info.file_size > CHECKPOINT_SLACK:
                raise KitError(f"{what}: its {name} is {info.file_size} bytes, more than the {CHECKPOINT_SLACK} a "
                               "checkpoint's pickle is read to")
            with z.open(info) as member:
                raw = member.read(CHECKPOINT_SLACK + 1)
    except KitError:
        raise
    except Exception as e:   # not a zip, a damaged directory, a compression zipfile cannot read ...
        raise KitError(f"{what}: not a PyTorch checkpoint in torch.save's zip format ({str(e)[:200] or type(e).__name__})") \
            from None
    if len(raw) > CHECKPOINT_SLACK:
        raise KitError(f"{what}: its {name} holds more than the {CHECKPOINT_SLACK} bytes a checkpoint's pickle is read to")
    try:
        records.check_pickle_shape(raw)
    except ValueError as e:
        raise KitError(f"{what}: refused before torch.load builds it: its {name} {str(e)[:200]}") from None


def _show_key(key) -> str:
    return records.describe(key, 120)


def _check_tensor(value, shape: tuple, what: str, nonnegative: bool = False) -> None:
    """A dense floating-point tensor of `shape` with finite values (and none < 0 where
    `nonnegative`), else one KitError naming `what`."""
    if not isinstance(value, torch.Tensor) or value.layout != torch.strided or not value.is_floating_point():
        raise KitError(f"{what}: not a dense floating-point tensor")
    if tuple(value.shape) != shape:
        raise KitError(f"{what}: shape {tuple(value.shape)}, the config's model has {shape}")
    if not torch.isfinite(value).all():
        raise KitError(f"{what}: holds non-finite values")
    if nonnegative and value.numel() and bool((value < 0).any()):
        raise KitError(f"{what}: holds negative values (Adam's second moments are squares; their square root "
                       "would be NaN)")


# Adam's param_group keys (torch.optim.Adam.__init__ and __setstate__): those whose value would
# change the run are compared with the config; the implementation switches must be the ones the
# kit's Adam is built with (a fused, capturable or differentiable group fails at the first step
# on a CPU, or takes another code path; maximize ascends; decoupled weight decay is AdamW)
ADAM_GROUP_KEYS = {"params", "lr", "betas", "eps", "weight_decay", "amsgrad", "maximize", "foreach", "capturable",
                   "differentiable", "fused", "decoupled_weight_decay", "param_names", "initial_lr"}
MAX_ADAM_STEP = 1 << 24    # a float32 step count is exact to 2^24; the reference's runs take 2,000


def check_optimizer_state(state_dict, params: list[tuple[str, tuple]], cfg: dict, what: str) -> None:
    """The optimizer_state_dict of a resumable checkpoint, checked before training against the
    Adam the run builds (one group of the model's parameters, in their order) and the config:
    what optimizer.load_state_dict and the first Adam step would otherwise fail on with a
    traceback, or take silently: every exp_avg, exp_avg_sq (and max_exp_avg_sq) of a
    parameter's shape, dense, floating-point, finite (the squares >= 0), every step a finite
    count 0..MAX_ADAM_STEP, the group's hyperparameters the config's (load_state_dict replaces
    the optimizer's with the file's: the log would show the config's and Adam use others)."""
    where = f"{what} key 'optimizer_state_dict'"
    if type(state_dict) is not dict or type(state_dict.get("state")) is not dict \
            or type(state_dict.get("param_groups")) is not list:
        raise KitError(f"{where}: not an optimizer's state_dict (state, param_groups)")
    groups = state_dict["param_groups"]
    if len(groups) != 1 or type(groups[0]) is not dict:
        raise KitError(f"{where}: {len(groups)} param_groups, the run's Adam has one (all the model's parameters)")
    group = groups[0]
    unknown = [k for k in group if type(k) is not str or k not in ADAM_GROUP_KEYS]
    if unknown:
        raise KitError(f"{where}: param_groups[0] holds {_show_key(unknown[0])}, not a key of Adam's")
    ids = group.get("params")
    if type(ids) is not list or not all(type(i) is int for i in ids) or len(set(ids)) != len(ids):
        raise KitError(f"{where}: param_groups[0].params is not a list of distinct parameter ids")
    if len(ids) != len(params):
        raise KitError(f"{where}: its param_groups hold {len(ids)} parameters, the model {len(params)}")
    o = cfg["optimizer"]
    want = {"betas": [float(b) for b in o["betas"]], "eps": float(o["eps"]), "weight_decay": float(o["weight_decay"]),
            "amsgrad": bool(o["amsgrad"])}
    for key, value in want.items():
        have = group.get(key)
        if key == "betas":
            ok = type(have) in (list, tuple) and len(have) == 2 and all(
                type(b) in (int, float) and float(b) == w for b, w in zip(have, value))
        elif key == "amsgrad":
            ok = have is value
        else:
            ok = type(have) in (int, float) and float(have) == value
        if not ok:
            shown = (f"[{', '.join(_show_key(b) for b in have)}]" if type(have) in (list, tuple) and len(have) <= 2
                     else _show_key(have))
            raise KitError(f"{where}: param_groups[0].{key} is {shown}, "
                           f"the config's optimizer.{key} {o[key]!r} (Adam would train with the file's; the log "
                           "would show the config's)")
    lr = group.get("lr")
    if type(lr) not in (int, float) or not math.isfinite(lr) or lr < 0:
        raise KitError(f"{where}: param_groups[0].lr is {_show_key(lr)}, not a learning rate >= 0")
    for key in ("maximize", "capturable", "differentiable", "decoupled_weight_decay", "fused"):
        if group.get(key) not in (None, False):
            raise KitError(f"{where}: param_groups[0].{key} is {_show_key(group.get(key))}, the run's Adam has it off")
    if group.get("foreach") not in (None, True, False):
        raise KitError(f"{where}: param_groups[0].foreach is {_show_key(group.get('foreach'))}, not true, false or null")
    shape_of = {i: params[k] for k, i in enumerate(ids)}
    moments = ("exp_avg", "exp_avg_sq") + (("max_exp_avg_sq",) if want["amsgrad"] else ())
    for key, entry in state_dict["state"].items():
        if type(key) is not int or key not in shape_of:
            raise KitError(f"{where}: state key {_show_key(key)} is not one of its param_groups' parameters")
        name, shape = shape_of[key]
        at = f"{where} state {key} ({name})"
        if type(entry) is not dict or (entry and set(entry) != {"step", *moments}):
            raise KitError(f"{at}: not Adam's state of a parameter ({', '.join(('step',) + moments)})")
        if not entry:
            continue
        for moment in moments:
            _check_tensor(entry[moment], shape, f"{at} {moment}", nonnegative=moment != "exp_avg")
        step = entry["step"]
        if isinstance(step, torch.Tensor):
            ok = step.dim() == 0 and step.layout == torch.strided and not step.is_complex() and step.dtype != torch.bool
            step = float(step) if ok else None
        elif type(step) in (int, float):
            step = float(step)
        else:
            step = None
        if step is None or not math.isfinite(step) or not 0 <= step <= MAX_ADAM_STEP:
            raise KitError(f"{at} step: not a step count 0..{MAX_ADAM_STEP}")


def read_checkpoint(path: str, cfg: dict) -> Checkpoint:
    """The reference's initialize_parameters_from_checkpoint up to the loading (train.py:305-325):
    the file's sha256 and torch.load(weights_only=True) of the same bytes, held in memory once
    and bounded by the config's model (_load_once, checkpoint_limit); then every tensor the run
    will take from it checked against the config's model (on the meta device) before a
    parameter is touched: each name, shape and dtype, values finite, and the optimizer's state
    (check_optimizer_state). A missing, unreadable, foreign or oversized file is one KitError
    naming it."""
    what = f"--checkpoint {path}"
    with torch.device("meta"):
        meta = M.AlphaFold(cfg)
    params = [(name, tuple(p.shape)) for name, p in meta.named_parameters()]
    sha256, loaded = _load_once(path, what, checkpoint_limit(sum(math.prod(s) for _, s in params)))
    if not isinstance(loaded, dict):
        raise KitError(f"{what}: holds a {type(loaded).__name__}, not a state_dict or a resumable checkpoint")
    if "alphafold_state_dict" in loaded and "optimizer_state_dict" in loaded:   # train.py:316-325
        state, optimizer_state = loaded["alphafold_state_dict"], loaded["optimizer_state_dict"]
    else:
        state, optimizer_state = loaded, None
    if not isinstance(state, dict):
        raise KitError(f"{what}: its alphafold_state_dict is a {type(state).__name__}, not a state_dict")
    want = {k: tuple(v.shape) for k, v in meta.state_dict().items()}
    for key, value in state.items():
        if type(key) is not str or key not in want:
            raise KitError(f"{what} key {_show_key(key)}: not a parameter of the config's model "
                           f"({cfg['name']}: {len(want)} tensors)")
        _check_tensor(value, want[key], f"{what} key {_show_key(key)}")
    missing = [k for k in want if k not in state]
    if missing:
        raise KitError(f"{what}: lacks {len(missing)} of the model's {len(want)} tensors (the first: {missing[0]})")
    if optimizer_state is not None:
        check_optimizer_state(optimizer_state, params, cfg, what)
    return Checkpoint(Path(path), sha256, state, optimizer_state)


# ------------------------------------------------------------------ the schedule, the average

class LRSchedule:
    """OpenFoldBenchmarkLRScheduler (lr_scheduler.py:81-118): called with the iteration at each
    optimizer step; sets the lr when it changes."""

    def __init__(self, optimizer, base_lr: float, warmup_lr_init: float, warmup_lr_iters: int):
        self.optimizer, self.base_lr, self.warmup_lr_iters = optimizer, base_lr, warmup_lr_iters
        self.warmup = torch.linspace(warmup_lr_init, base_lr, warmup_lr_iters, dtype=torch.float64)
        self.lr: float | None = None

    def value(self, iteration: int) -> float:
        if iteration <= self.warmup_lr_iters:
            return round(self.warmup[iteration - 1].item(), 10)
        return self.base_lr

    def __call__(self, iteration: int) -> None:
        lr = self.value(iteration)
        if lr != self.lr:
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            self.lr = lr


class EMA:
    """swa_avg_fn (swa.py:46-70): avg + (p - avg) x (1 - decay_rate)."""

    def __init__(self, decay_rate: float):
        self.decay_rate = decay_rate

    def __call__(self, averaged: torch.Tensor, current: torch.Tensor, num_averaged) -> torch.Tensor:
        return averaged + (current - averaged) * (1.0 - self.decay_rate)


# ------------------------------------------------------------------ the data

def data_files(layout: records.Layout) -> list[Path]:
    """Every file of the processed layout the run reads (for the cache clearing and staging)."""
    files = [layout.chains, layout.obsolete]
    for folder in (layout.dicts, layout.alignments):
        if not folder.is_dir():
            raise KitError(f"{folder}: missing folder of the reference's processed layout "
                           f"(records.Layout: {records.PDB_MMCIF_DIR}/{records.DICTS_DIR}, {records.ALIGNMENTS_DIR})")
        files += sorted(p for p in folder.iterdir() if p.is_file())
    for f in files:
        if not f.is_file():
            raise KitError(f"{f}: missing file of the reference's processed layout")
    return files


def find_layout(root: str) -> tuple[records.Layout, list[Path]]:
    path = Path(root)
    if not path.is_dir():
        raise KitError(f"{root}: data directory does not exist")
    layout = records.Layout.under(path)
    return layout, data_files(layout)


def stage_tree(files: list[Path], root: Path, dest: Path) -> int:
    """Staging (MLPerfRun.stage's write): the data set's files copied to dest, under their paths
    relative to the data root; returns the bytes copied."""
    return copy_files(files, dest, root)


class Failed:
    """A sample that could not be made (its KitError's one line), carried back from a loader
    worker whole, so the run stops with the line naming the file, not a worker's traceback."""

    def __init__(self, message: str):
        self.message = message


class Samples(torch.utils.data.Dataset):
    """PDBDataset.__getitem__ (datasets.py:78-139) over a fixed list of (index, seed) pairs."""

    def __init__(self, chains: list[records.Chain], pairs: list[tuple[int, int]], layout: records.Layout,
                 index: records.AlignmentIndex, source, dc: TR.DataConfig, mode: str):
        self.chains, self.pairs, self.layout, self.index = chains, pairs, layout, index
        self.source, self.dc, self.mode = source, dc, mode

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, k: int):
        i, seed = self.pairs[k]
        try:
            return TR.make_example(records.read_sample(self.chains[i], self.layout, self.index), self.source, self.dc,
                                   self.mode, seed)
        except KitError as e:
            return Failed(str(e))


def collate(samples: list):
    failed = [s for s in samples if isinstance(s, Failed)]
    return failed[0] if failed else TR.collate(samples)


def loader(dataset: Samples, batch_size: int, workers: int, sampler=None):
    """The reference's DataLoader over `dataset` in its own order (the pairs'), or the order of
    `sampler` where one is given (bench/feed_rate.py's epochs)."""
    return torch.utils.data.DataLoader(dataset, batch_size=batch_size, shuffle=False, sampler=sampler, drop_last=True,
                                       num_workers=workers, collate_fn=collate, persistent_workers=workers > 0,
                                       prefetch_factor=4 if workers > 0 else None)   # dataloaders.py:42-51


def batches(dataloader):
    for batch in dataloader:
        if isinstance(batch, Failed):
            raise KitError(batch.message)
        yield batch


def to_device(batch: dict, device) -> dict:
    return {k: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


# ------------------------------------------------------------------ the model and its step

class Trainer:
    def __init__(self, cfg: dict, launched, checkpoint: Checkpoint | None):
        self.cfg, self.device, self.comm, self.seed = cfg, launched.device, launched.comm, launched.seed
        self.rank = launched.ranks.rank if self.comm.kind != "none" else None   # train.py:391, 408
        o, t = cfg["optimizer"], cfg["train"]
        # create_alphafold_module (train.py:287-302): seeded, the global generators put back
        state = torch.get_rng_state()
        torch.manual_seed(records.seed_from_string(f"alphafold_init_{self.seed}"))
        self.model = M.build_model(cfg)
        torch.set_rng_state(state)
        self.model.to(self.device)
        self.model.train()
        self.loss = L.AlphaFoldLoss()
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=o["base_lr"], betas=tuple(o["betas"]),
                                          eps=o["eps"], weight_decay=o["weight_decay"], amsgrad=o["amsgrad"])
        self.schedule = LRSchedule(self.optimizer, o["base_lr"], o["warmup_lr_init"], o["warmup_lr_iters"])
        if checkpoint is not None:   # train.py:327-342
            self.model.load_state_dict(checkpoint.model_state, strict=True)
            if checkpoint.optimizer_state is not None:
                try:
                    self.optimizer.load_state_dict(checkpoint.optimizer_state)
                except (ValueError, KeyError, TypeError, RuntimeError) as e:
                    raise KitError(f"--checkpoint {checkpoint.path} key 'optimizer_state_dict': the optimizer "
                                   f"cannot take it ({str(e).splitlines()[0][:200]})") from None
        self.swa = None
        if cfg["swa"]["enabled"]:   # swa.py:24-34, after the checkpoint's parameters (train.py:587-592)
            self.swa = torch.optim.swa_utils.AveragedModel(self.model, avg_fn=EMA(cfg["swa"]["decay_rate"]))
        self.net = self.comm.wrap_model(self.model) if self.comm.kind in ("torch", "horovod") else self.model
        self.accumulation = t["gradient_accumulation_iters"]
        self.iteration = 0

    def step(self, batch: dict) -> int:
        """One training iteration (train.py:747-789); returns the samples it took. The
        forward's seed is set after the batch is made: the reference sets it before asking its
        loader, whose workers make the batch with generators of their own (the samples' seeds),
        so the order changes nothing."""
        self.iteration += 1
        it = self.iteration
        torch.manual_seed(records.seed_from_string(f"forward_{self.seed}_{self.rank}_{it}"))
        batch = to_device(batch, self.device)
        outputs = self.net(batch)
        loss, _ = self.loss(outputs, TR.last_iteration(batch))
        loss = loss / self.accumulation
        if (it - 1) % self.accumulation == 0:
            self.optimizer.zero_grad()
        loss.backward()
        if it % self.accumulation == 0:
            if self.comm.kind == "horovod":
                self.comm.average_gradients(self.model.parameters())
            o = self.cfg["optimizer"]
            if o["gradient_clipping"]:
                norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm=o["clip_grad_max_norm"])
            else:
                grads = [p.grad for p in self.model.parameters() if p.grad is not None]
                norm = torch.stack(torch._foreach_norm(grads)).norm()
            check_finite(float(norm), it, "the gradient norm")
            self.schedule(it)
            self.optimizer.step()
            if self.swa is not None:
                self.swa.update_parameters(self.model)
        return int(batch["aatype"].shape[0])

    def evaluate(self, dataloader, pairs: list[tuple[int, int]], counted: list[bool], n_valid: int) -> list[float]:
        """lDDT-Ca of every target this rank evaluates (train.py:347-380), at its index in a
        vector of all targets (0 elsewhere, and where a padded repeat is not counted)."""
        model = self.swa if self.swa is not None else self.model
        model.eval()
        values = [0.0] * n_valid
        with torch.no_grad():
            for (i, _), count, batch in zip(pairs, counted, batches(dataloader)):
                batch = to_device(batch, self.device)
                out = model(batch)
                last = TR.last_iteration(batch)
                lddt = L.validation_lddt_ca(out["final_atom_positions"], last["all_atom_positions"],
                                            last["all_atom_mask"])
                if count:
                    values[i] = float(lddt.reshape(-1)[0])
        model.train()
        return values

    def fingerprint(self) -> float:
        return float(sum(p.detach().double().abs().sum().item() for p in self.model.parameters()))


# ------------------------------------------------------------------ the log

def hyperparameters(cfg: dict, global_batch: int, checkpoint: Checkpoint | None, parameters: int) -> list:
    """The keys train.py logs between its submission keys and staging, in its order
    (train.py:444-604)."""
    o, s, t = cfg["optimizer"], cfg["swa"], cfg["train"]
    dc = TR.data_config(cfg)
    lc = L.AlphaFoldLoss().config
    return [
        (C.GLOBAL_BATCH_SIZE, global_batch),
        (C.GRADIENT_ACCUMULATION_STEPS, t["gradient_accumulation_iters"]),
        ("target_avg_lddt_ca_value", t["target_avg_lddt_ca"]),
        ("train_max_pdb_release_date", t["train_max_pdb_release_date"]),
        ("val_min_cameo_submission_date", t["val_min_cameo_submission_date"]),
        ("val_max_cameo_submission_date", t["val_max_cameo_submission_date"]),
        ("val_max_sequence_length", t["val_max_sequence_length"]),
        ("val_every_iters", t["val_every_iters"]),
        ("precision", t["precision"]),
        ("train_sequence_crop_size", dc.crop_size),
        ("num_recycling_iters", dc.num_recycling_iters),
        ("max_msa_clusters", dc.max_msa_clusters),
        ("max_extra_msa", dc.max_extra_msa),
        ("templates_enabled", dc.templates_enabled),
        ("max_templates", dc.max_templates),
        ("fape_loss_weight", lc["fape_loss_config"]["weight"]),
        ("fape_loss_backbone_weight", lc["fape_loss_config"]["backbone_weight"]),
        ("fape_loss_sidechain_weight", lc["fape_loss_config"]["sidechain_weight"]),
        ("supervised_chi_loss_weight", lc["supervised_chi_loss_config"]["weight"]),
        ("distogram_loss_weight", lc["distogram_loss_config"]["weight"]),
        ("masked_msa_loss_weight", lc["masked_msa_loss_config"]["weight"]),
        ("plddt_loss_weight", lc["plddt_loss_config"]["weight"]),
        (C.OPT_NAME, o["name"]),
        (C.OPT_BASE_LR, o["base_lr"]),
        (C.OPT_ADAM_BETA_1, o["betas"][0]),
        (C.OPT_ADAM_BETA_2, o["betas"][1]),
        (C.OPT_ADAM_EPSILON, o["eps"]),
        (C.OPT_WEIGHT_DECAY, o["weight_decay"]),
        ("opt_amsgrad", o["amsgrad"]),
        ("opt_gradient_clipping", o["gradient_clipping"]),
        (C.OPT_GRADIENT_CLIP_NORM, o["clip_grad_max_norm"]),
        ("opt_learning_rate_warmup_init", o["warmup_lr_init"]),
        (C.OPT_LR_WARMUP_STEPS, o["warmup_lr_iters"]),
        ("init_checkpoint_sha256sum", checkpoint.sha256 if checkpoint is not None else NO_CHECKPOINT_SHA256),
        ("swa_enabled", s["enabled"]),
        ("swa_decay_rate", s["decay_rate"]),
        ("model_parameters_count", parameters),
    ]


# ------------------------------------------------------------------ the run

class OpenFoldParts(Parts):
    """OpenFold's parts of the run (common/lifecycle.py): the Trainer (from --checkpoint where
    given), the whole data set staged per node, the reference's training and CAMEO selections,
    sampler and recycling schedule; an "epoch" is one evaluation cycle of val_every_iters steps,
    logged under the training samples seen by its end."""

    descriptor, style = DESCRIPTOR, LOG_STYLE

    def __init__(self, cfg: dict, launched, global_batch: int, data_dir: str, layout, files: list[Path],
                 checkpoint: Checkpoint | None):
        super().__init__(cfg, launched, global_batch)
        self.root, self.layout, self.files, self.checkpoint = Path(data_dir), layout, files, checkpoint
        self.val_every = cfg["train"]["val_every_iters"]

    @property
    def n_epochs(self) -> int:
        return self.cfg["train"]["num_train_iters"] // self.val_every

    def epoch_num(self, epoch: int) -> int:
        return epoch * self.global_batch * self.val_every

    def hyperparameters(self):
        # the count train.py:600-604 logs of the built model: the config's architecture's, which
        # validate_config checked against train.model_parameters_count
        return hyperparameters(self.cfg, self.global_batch, self.checkpoint, M.parameter_count(self.cfg))

    def input_files(self):
        return self.files

    def build(self, run):
        self.trainer = Trainer(self.cfg, self.launched, self.checkpoint)
        self.checkpoint = None   # its tensors are the model's and the optimizer's now

    def prepare(self, run):
        cfg, launched, ranks, files, root = self.cfg, self.launched, self.ranks, self.files, self.root
        d, t = cfg["data"], cfg["train"]
        dc = TR.data_config(cfg)
        # staging: the whole data set per node (every rank samples from all chains)
        staged = run.stage({"data": files}, launched.stage_dir, lambda _, dest: stage_tree(files, root, dest),
                           "the whole data set, its layout kept (every rank samples from all chains)")
        layout = records.Layout.under(staged["data"]) if staged is not None else self.layout

        # the data sets, as the reference builds them after run_start (train.py:639-669)
        chains = records.read_chains(layout.chains)
        index = records.AlignmentIndex(layout.alignments)
        train_chains = records.training_chains(chains, index, t["train_max_pdb_release_date"],
                                               t["filter_by_alignments"])
        run.log.event(C.TRAIN_SAMPLES, len(train_chains))
        valid_chains = records.validation_chains(chains, index, t["val_min_cameo_submission_date"],
                                                 t["val_max_cameo_submission_date"], t["val_max_sequence_length"],
                                                 t["filter_by_alignments"], chains_path=str(layout.chains))
        run.log.event(C.EVAL_SAMPLES, len(valid_chains))
        if not train_chains or not valid_chains:
            empty = "training chains" if not train_chains else "CAMEO validation targets"
            raise KitError(f"{layout.chains}: selects no {empty} (the reference's selection: "
                           "records.training_chains, records.validation_chains)")
        for key, have, want, rule in (("data.n_train", len(train_chains), d["n_train"], "train_samples"),
                                      ("data.n_valid", len(valid_chains), d["n_valid"], "eval_samples")):
            if have != want and ranks.is_root:   # the reference logs what it selects; the rules judge it
                what = "training chains" if key == "data.n_train" else "CAMEO validation targets"
                print(f"hpckit train: warning: {layout.chains} selects {have} {what}, config key '{key}' says "
                      f"{want}: the log's {rule} fails the rules' check", file=sys.stderr, flush=True)

        # training: the sampler's pairs, this rank's share, the recycling schedule
        distributed = self.comm.kind != "none"
        pairs = records.training_index_seed_pairs(
            records.sampler_weights(train_chains), t["num_train_iters"], d["batch_size"], self.global_batch,
            records.training_sampler_seed(launched.seed), ranks.rank if distributed else None,
            ranks.size if distributed else None)
        workers = d["loader_workers"]
        train_set = Samples(train_chains, pairs, layout, index, TR.template_source(chains, layout, dc, "train"), dc,
                            "train")
        self.train_iter = iter(batches(loader(train_set, d["batch_size"], workers)))
        self.schedule = TR.RecyclingSchedule(TR.training_dataloader_seed(launched.seed), dc.num_recycling_iters,
                                             t["gradient_accumulation_iters"])
        run.log.event("initial_training_dataloader_type", t["dataloader_type"])

        # validation: ValidationSampler's share of this rank, each target counted once
        self.n_valid = len(valid_chains)
        self.valid_pairs = records.validation_index_seed_pairs(valid_chains, ranks.rank if distributed else None,
                                                               ranks.size if distributed else None)
        self.counted = [k * ranks.size + ranks.rank < self.n_valid if distributed else True
                        for k in range(len(self.valid_pairs))]
        self.valid_loader = loader(Samples(valid_chains, self.valid_pairs, layout, index,
                                           TR.template_source(chains, layout, dc, "eval"), dc, "eval"), 1,
                                   min(workers, EVAL_WORKERS))

    def cycle(self, n: int):
        for _ in range(n):
            yield self.schedule(next(self.train_iter))

    def train_epoch(self, epoch, run):
        n = 0
        for batch in run.limited(self.cycle(self.val_every)):
            n += self.trainer.step(batch)
        return self.comm.allreduce_sum([n])[0]

    def evaluate(self):
        values = self.comm.allreduce_sum(self.trainer.evaluate(self.valid_loader, self.valid_pairs, self.counted,
                                                               self.n_valid))
        return L.average_lddt_ca(values), self.n_valid

    def fingerprint(self):
        return self.trainer.fingerprint()


def train(args) -> int:
    cfg = load_pytorch_config(args, BENCHMARK, "OpenFold", validate_config)
    claim_output_dir(args.output_dir, getattr(args, "instances", 1))
    layout, files = find_layout(args.data)
    checkpoint = read_checkpoint(args.checkpoint, cfg) if getattr(args, "checkpoint", None) else None
    launched = launch(args, "pytorch", cfg)
    want_sha = cfg["train"]["init_checkpoint_sha256"]
    have_sha = checkpoint.sha256 if checkpoint is not None else NO_CHECKPOINT_SHA256
    if have_sha != want_sha and launched.ranks.is_root:
        start = f"--checkpoint {args.checkpoint}" if checkpoint is not None else "no checkpoint"
        print(f"hpckit train: warning: config key 'train.init_checkpoint_sha256' names the checkpoint "
              f"{want_sha[:12]}..., this run starts from {start} ({have_sha[:12]}...): its log fails the rules' "
              "init_checkpoint_sha256sum check", file=sys.stderr, flush=True)
    global_batch = cfg["data"]["batch_size"] * launched.ranks.size
    if cfg["train"]["num_train_iters"] * global_batch > MAX_TRAIN_SAMPLES:   # the sampler draws them all at init
        raise KitError(f"config key 'train.num_train_iters': {cfg['train']['num_train_iters']} iterations of a global "
                       f"batch of {global_batch} are more than the {MAX_TRAIN_SAMPLES} samples a run draws")
    return lifecycle.train(OpenFoldParts(cfg, launched, global_batch, args.data, layout, files, checkpoint),
                           args.output_dir)
