#!/usr/bin/env python3
"""The kit's GPU path proven in one command on a lent NVIDIA node, printed as one table.

    make gpu-check [REFERENCE=DIR]        # the GPU node: its python3 with PyTorch, the kit's wheels
    make gpu-check DRY=1                  # anywhere (CI): every part on the CPU at tiny sizes
    python3 bench/gpu_check.py [--reference DIR] [--dry] [--parts P,...] [--out DIR] [--keep]

Needs PyTorch (with CUDA, unless --dry), h5py, and the kit's pure-Python dependencies
(mlperf-logging, crc32c, PyYAML, reframe-hpc for the ReFrame part): `make gpu-wheels` puts
them in .whl/ for a node that cannot reach PyPI. No TensorFlow: the TensorFlow CosmoFlow
is not a GPU path of the kit (`--framework auto` picks PyTorch on GPUs).

Parts, in this order (the timed ones first, while nothing else runs; what this kit's users
run first: the whole path from files):

  e2e       `hpckit train --config reference` from files, as a centre runs it (full-size
            synthetic samples, 16 distinct hard-linked to 128 names, page cache warm; CosmoFlow
            staged with data.stage_decode; data.loader_workers auto), step-limited to 4 epochs:
            DeepCAM fp16 at local batch 8 and 1 and fp32 at 2 (the reference's), CosmoFlow fp16
            and fp32 at 1, OpenCatalyst fp32 at 8; last, OpenFold fp32 (its only precision) at
            local batch 1 (the reference's), which has no epochs: 4 train/eval cycles of 4 steps
            (one period of its recycling draws each) on one datagen chain cropped to 256, each
            followed by the evaluation of one 495-residue validation target (OPENFOLD_E2E_LIMIT_S
            bounds it). Per run: the sustained training samples/s (median epoch after the first:
            what a full-size run's long epochs see; OpenFold: its cycles' samples over their
            training time, after the first; hpckit/results/timeline.py), the first epoch's
            seconds (cuDNN autotuning, the CUDA graph's capture, the first reads), the rate per
            epoch with evaluation, the input wait and GPU busy shares and the GPU's energy from
            the run's summary.json, and the step's rate inside the run after the first epoch
            (the sustained rate over those epochs' GPU busy share, CUDA events).
            About 4 minutes on an H100 without OpenFold's run (likely 1.5-3 more, not yet timed
            on a GPU), the step part 2 more.
  step      one full-size training step of the kit (the trainers' own train_epoch on
            batches already on the GPU: no data loading), at the precisions and local batches
            of the e2e runs, and DeepCAM fp32 at local batch 2 beside the reference's step
            (DeepLabv3_plus + CELoss from your clone of mlcommons/hpc, --reference, with
            torch's AdamW: its LAMB needs NVIDIA apex); --all-steps adds bf16 and contiguous +
            eager cases. Samples/s (median of the timed steps, after warm-up), peak GPU memory.
            The reference CosmoFlow is TensorFlow: NVIDIA's rate stands in. Last, OpenFold's
            own Trainer.step at the reference config (48 Evoformer blocks, crop 256, 93,229,082
            parameters) in fp32 (its only precision) at local batch 1, on one datagen chain
            made by its train.py pipeline and cut per step by its recycling schedule (0-3
            recycling iterations, each once in 4 steps): one period of warm-up, the mean step
            of 2 timed periods (the e2e run's target's step; not yet timed on a GPU: bounded by
            OPENFOLD_STEP_BUDGET_S and OPENFOLD_STEP_LIMIT_S).
  mini      the mini trainings on the GPU (CosmoFlow and DeepCAM, --deterministic twice and
            without): converged, epochs, the official checker's verdict, and whether the
            two deterministic runs gave the same curve. (Not OpenFold: see part_mini.)
  torchrun  torchrun + torch.distributed (NCCL on a GPU) with one rank, mini DeepCAM.
  reframe   the local profile's ReFrame checks that run on a GPU (CosmoFlow with PyTorch,
            DeepCAM, OpenCatalyst, OpenFold where present), deterministic as shipped: PASS or
            FAIL.

Then the targets with their verdicts: from files at least 0.9x the step at the same
precision and local batch (issue 40; the step part's figure, else the step inside the run),
and per H100 above NVIDIA's v3.0 rates with evaluation (71.2 DeepCAM samples/s at local batch
8, 27.3 at 1, 185 CosmoFlow at 1); the kit's fp32 DeepCAM step at least the reference's, its
fastest at least 1.5x the reference and at least NVIDIA's v3.0 per-H100 step rates (DeepCAM
30 samples/s at local batch 1, 82 at 8; CosmoFlow 206 at 1) (issue 32).

`--workdir DIR` puts the work into a new directory inside DIR (removed at the end unless
--keep or a part failed; nothing else in DIR is touched); `--out DIR` takes a directory that
does not hold a gpu_check.txt or gpu_check.json yet (one line and exit 2 otherwise).

--dry runs every part on the CPU at the mini sizes, step-limited, the ReFrame part as
`reframe --dry-run`: a check that the command still works (CI runs it), not figures.
Exit 0 when every part ran and every PASS/FAIL row passed, 1 otherwise; bad arguments 2.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import gc
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import REPO, bad as _bad, check_writable, cpu_flags, cpu_model  # noqa: E402

PARTS = ("e2e", "step", "mini", "torchrun", "reframe")
NVIDIA_H100 = {("deepcam", 1): 30.0, ("deepcam", 8): 82.0, ("cosmoflow", 1): 206.0}
# with evaluation: NVIDIA's v3.0 eos logs, per GPU (../shared/reference/nvidia-v3-gpu-facts.md)
NVIDIA_H100_E2E = {("deepcam", 1): 27.3, ("deepcam", 8): 71.2, ("cosmoflow", 1): 185.0}
# the e2e runs: (benchmark, local batch, precision, extra --set); the step part measures the same
E2E_EPOCHS = 4
# OpenFold has no epochs: E2E_EPOCHS train/eval cycles of val_every_iters steps, each cycle one
# period of its recycling draws (0-3 recycling iterations, each once in 4 steps at the reference,
# 0-1 in 2 at mini: transforms.RecyclingSchedule), so that every cycle trains what the step
# part's timed periods do; num_train_iters is the whole run (no train.n_epochs, no max_steps)
OPENFOLD_E2E_CYCLE = {"reference": 4, "mini": 2}


def openfold_e2e_sets(config: str) -> list[str]:
    k = OPENFOLD_E2E_CYCLE[config]
    return [f"train.val_every_iters={k}", f"train.num_train_iters={E2E_EPOCHS * k}"]


# OpenFold's e2e run last: the least needed figure and the longest run. Not timed on a GPU yet;
# expected on an H100: 16 steps of 1-3 s (the reference-size step, 0-3 recycling iterations),
# 4 evaluations of its one 495-residue validation target (every recycling iteration, the whole
# chain: several seconds to about 15 s each), the 93M-parameter model's init and the loader's
# workers: about 1.5-3 minutes. Killed after OPENFOLD_E2E_LIMIT_S (its row an ERROR, no figure).
OPENFOLD_E2E_LIMIT_S = 300
E2E_RUNS = (("deepcam", 8, "fp16", []), ("deepcam", 1, "fp16", []), ("cosmoflow", 1, "fp16", ["data.stage_decode=true"]),
            ("deepcam", 2, "fp32", []), ("cosmoflow", 1, "fp32", ["data.stage_decode=true"]), ("oc20", 8, "fp32", []),
            ("openfold", 1, "fp32", openfold_e2e_sets("reference")))
# the step part's benchmarks, in order: OpenFold last (its step beside its e2e run: the target)
STEP_BENCHMARKS = ("deepcam", "cosmoflow", "oc20", "openfold")
# OpenFold's step at the reference's size is not timed on a GPU yet (on 2 CPU cores one step
# with 3 recycling iterations took 2,369 s, openfold/train.py), so its time is bounded twice:
# no second timed period starts that would end past OPENFOLD_STEP_BUDGET_S from the case's
# start (datagen of one chain, the pipeline, the 93M-parameter model, the warm-up period), and
# the child is killed after OPENFOLD_STEP_LIMIT_S (its row an ERROR, no figure): at most 7 of
# the GPU session's 15 minutes
OPENFOLD_STEP_BUDGET_S = 240
OPENFOLD_STEP_LIMIT_S = 420
FEED_TARGET = 0.9
RESULT = "GPU_CHECK_RESULT "


def bad(message: str) -> None:
    _bad("gpu_check", message)


def kit_env() -> dict:
    path = str(REPO / "apps")
    old = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": f"{path}:{old}" if old else path, "PYTHONUNBUFFERED": "1",
            "TF_CPP_MIN_LOG_LEVEL": "3"}


def hpckit(*args) -> list[str]:
    return [sys.executable, "-m", "hpckit", *map(str, args)]


def run(cmd, log: Path, timeout: float, env=None, cwd=None) -> subprocess.CompletedProcess:
    """A command, its output kept in `log`."""
    cmd = [str(c) for c in cmd]
    with open(log, "w") as out:
        try:
            proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, text=True, timeout=timeout,
                                  env=env or kit_env(), cwd=cwd or REPO)
        except subprocess.TimeoutExpired:
            out.write(f"\ngpu_check: timed out after {timeout:.0f} s\n")
            return subprocess.CompletedProcess(cmd, 124)
    return proc


def tail(log: Path, n: int = 1) -> str:
    lines = [l for l in log.read_text(errors="replace").splitlines() if l.strip()] if log.exists() else []
    return " | ".join(lines[-n:])[-300:] if lines else "no output"


def graph_note(log: Path) -> str:
    """The kit's warning when a CUDA graph could not be captured (the run went on eager)."""
    text = log.read_text(errors="replace") if log.exists() else ""
    hit = next((l for l in text.splitlines() if "could not be captured" in l), None)
    return f" [{hit.split('warning: ', 1)[-1][:150]}]" if hit else ""


def summary(out: Path) -> dict:
    try:
        return json.loads((out / "summary.json").read_text())
    except (OSError, ValueError):
        return {}


# ---------------------------------------------------------------- part: step (child process)

def step_cases(bench: str, dry: bool, reference: str | None, everything: bool = False) -> list[tuple[str, str, int, list[str]]]:
    """(who, precision, local batch, config overrides) per case: the e2e runs' precisions
    and batches, and the reference's local batch 2 in fp32 beside the reference's own step;
    `everything` (--all-steps) adds bf16 and the kit's defaults against contiguous + eager."""
    eager = ["train.memory_format=contiguous", "train.cuda_graph=false"]
    if bench == "openfold":   # fp32 only (validate_config: the reference refuses bf16, fp16, amp), local batch 1
        return [("kit", "fp32", 1, [])]
    if dry:   # the CPU: the kit's path in fp32, and fp16's refusal where it would be emulated
        return [("kit", q, 1, []) for q in ("fp32", "fp16")]
    cases = [("kit", q, b, []) for (name, b, q, _) in E2E_RUNS if name == bench]
    if bench == "deepcam":   # ~33 s a case on an H100, most of it cuDNN's autotuning
        cases = ([("reference", "fp32", 2, [])] if reference else []) + cases
        if everything:
            cases += [("kit eager contiguous", "fp32", 2, eager), ("kit", "bf16", 2, []), ("kit", "fp16", 2, [])]
    elif everything:
        cases += [("kit eager contiguous", "fp32", 4, eager), ("kit", "fp32", 4, []), ("kit", "bf16", 1, []),
                  ("kit", "bf16", 4, [])]
    return cases


def run_step_child(bench: str, dry: bool, reference: str | None, warmup: int, steps: int,
                   everything: bool = False, runs: int = 3) -> None:
    import torch
    from hpckit.common import step as kit_step
    from hpckit.common.config import load_config
    from hpckit.common.errors import KitError
    from hpckit.common.run import launch
    cuda = torch.cuda.is_available() and not dry
    dev = "cuda" if cuda else "cpu"

    def sync():
        if cuda:
            torch.cuda.synchronize()

    for who, prec, batch, sets in step_cases(bench, dry, reference, everything):
        label = f"{who} {prec} b{batch}"
        case_started = time.perf_counter()
        result = {"benchmark": bench, "who": who, "precision": prec, "batch": batch, "label": label}
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        try:
            cfg = load_config(bench, "mini" if dry else "reference",
                              [*sets, f"data.batch_size={batch}", f"train.precision={prec}"])
            if bench == "openfold":   # its train() validates (load_pytorch_config): so does the step
                from hpckit.openfold.train import validate_config
                validate_config(cfg)
            gen = torch.Generator().manual_seed(0)
            if who == "reference":
                fn = reference_deepcam_step(reference, cfg, batch, gen)
            else:
                # OpenFold's mini model on the CPU (--dry): one thread, as its ReFrame check runs it
                # (reframe_checks/openfold.py: two threads beside a busy process were 20x slower)
                threads = 1 if dry and bench == "openfold" else None
                args = argparse.Namespace(seed=1, stage_dir=None, data=".", dist="none", device=dev, threads=threads,
                                          collective_timeout=60.0, deterministic=False, allocator="glibc")
                launched = launch(args, "pytorch", cfg)
                if bench not in ("oc20", "openfold"):   # their steps are their own (no graph, no memory format)
                    kit_step.resolve_options(cfg, launched.device, True, cfg["optimizer"]["name"])
                    result["cuda_graph"] = cfg["train"]["cuda_graph"]
                    result["memory_format"] = cfg["train"]["memory_format"]
                fn = {"deepcam": kit_deepcam_step, "cosmoflow": kit_cosmoflow_step,
                      "oc20": kit_oc20_step, "openfold": kit_openfold_step}[bench](cfg, launched, batch, gen)
            # OpenFold: whole periods of its recycling draws (each count once a period), so that
            # every timed run's mean step is the training's mean step
            period = getattr(fn, "period", 1)
            n_warmup, n_steps = -(-warmup // period) * period, -(-steps // period) * period
            fn(n_warmup)
            sync()
            times = []
            budget = OPENFOLD_STEP_BUDGET_S if bench == "openfold" else None
            for _ in range(runs):                   # `runs` timed runs (3) of `n_steps` steps each: median
                if times and budget and time.perf_counter() - case_started + times[-1] * n_steps > budget:
                    break                           # one more run would pass the budget: the figure as it is
                t0 = time.perf_counter()
                fn(n_steps)
                sync()
                times.append((time.perf_counter() - t0) / n_steps)
            s = statistics.median(times)
            if getattr(fn, "note", None):
                result["note"] = f"{fn.note}; {n_warmup} warm-up, {len(times)} x {n_steps} timed"
            result["graph_error"] = getattr(getattr(getattr(fn, "trainer", None), "step", None), "graph_error", None)
            result.update(status="ok", seconds_per_step=s, samples_per_s=batch / s,
                          peak_gpu_gib=torch.cuda.max_memory_allocated() / 2 ** 30 if cuda else None)
        except KitError as e:
            result.update(status="refused", reason=str(e))
        except Exception as e:   # a case that breaks is a row of the table, not the end of it
            result.update(status="error", reason=f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
        print(RESULT + json.dumps(result), flush=True)
        fn = None


def _device_batch(cfg: dict, bench: str, batch: int, gen, device, memory_format):
    import torch
    d = cfg["data"]
    if bench == "deepcam":
        x = torch.randn(batch, d["n_channels"], d["height"], d["width"], generator=gen)
        y = torch.randint(0, cfg["model"]["n_classes"], (batch, d["height"], d["width"]), generator=gen)
        return x.to(device).contiguous(memory_format=memory_format), y.to(device)
    s = d["sample_size"]
    x = torch.log1p(torch.poisson(torch.full((batch, s, s, s, 4), 3.0), generator=gen))
    return x.to(device), (torch.rand(batch, 4, generator=gen) * 2 - 1).to(device)


def kit_deepcam_step(cfg, launched, batch, gen):
    from hpckit.common import step as kit_step
    from hpckit.deepcam.train import Trainer
    trainer = Trainer(cfg, launched)
    xy = _device_batch(cfg, "deepcam", batch, gen, launched.device, kit_step.torch_memory_format(cfg, 2))
    fn = lambda n: trainer.train_epoch([xy] * n)   # noqa: E731
    fn.trainer = trainer
    return fn


def kit_cosmoflow_step(cfg, launched, batch, gen):
    from hpckit.cosmoflow.train import TorchBackend
    backend = TorchBackend(cfg, launched, Path("."))
    xy = _device_batch(cfg, "cosmoflow", batch, gen, launched.device, None)
    in_memory = argparse.Namespace(files=[Path("in-memory")])   # named only if reading fails
    fn = lambda n: backend.train_epoch([xy] * n, in_memory, 1e-3)   # noqa: E731
    fn.trainer = backend
    return fn


def kit_oc20_step(cfg, launched, batch, gen):
    """OpenCatalyst's trainer on one batch of datagen's structures already on the device
    (its to_device then moves nothing)."""
    import tempfile as _tempfile
    from hpckit.oc20 import data as odata
    from hpckit.oc20.synthetic import write_dataset
    from hpckit.oc20.train import Trainer
    with _tempfile.TemporaryDirectory(prefix="hpckit-gpu-check-oc20-") as tmp:
        write_dataset(Path(tmp) / "d", cfg, batch, 1, seed=1, workers=1)
        split = odata.find_dataset(Path(tmp) / "d", batch, 1)["train"]
        on_device = odata.to_device(odata.collate([split.read(i) for i in range(batch)]), launched.device)
    trainer = Trainer(cfg, launched)
    fn = lambda n: trainer.train_epoch([on_device] * n)   # noqa: E731
    fn.trainer = trainer
    return fn


def kit_openfold_step(cfg, launched, batch, gen):
    """OpenFold's Trainer.step as train.py's training loop calls it (OpenFoldParts.cycle,
    train_epoch): one batch of `hpckit datagen openfold` chains as long as the crop (every
    sample a whole crop: the config's sizes) made by train.py's own pipeline (the training
    sampler's (index, seed) pairs, Samples, loader, batches), cut before each step by the kit's
    RecyclingSchedule (0..num_recycling_iters recycling iterations drawn per optimizer step,
    each count once a period, shuffled; the forward runs one more iteration than the draw, the
    last with autograd). Each cut is put on the device once, as train.py's to_device makes it,
    before the timing (the warm-up is a whole period): Trainer.step's to_device moves nothing."""
    import tempfile as _tempfile
    from hpckit.openfold import records
    from hpckit.openfold import transforms as TR
    from hpckit.openfold.synthetic import write_dataset
    from hpckit.openfold.train import Samples, Trainer, batches, loader, to_device
    d, t = cfg["data"], cfg["train"]
    dc = TR.data_config(cfg)
    synth = d.get("synthetic") or {}
    with _tempfile.TemporaryDirectory(prefix="hpckit-gpu-check-openfold-") as tmp:
        root = Path(tmp) / "d"
        write_dataset(root, batch, 1, seed=1, crop=dc.crop_size, min_length=dc.crop_size, max_length=dc.crop_size,
                      msa_depth=synth.get("msa_depth", 16), num_shards=1, segments=synth.get("segments"))
        layout = records.Layout.under(root)
        chains = records.read_chains(layout.chains)
        index = records.AlignmentIndex(layout.alignments)
        train_chains = records.training_chains(chains, index, t["train_max_pdb_release_date"],
                                               t["filter_by_alignments"])
        pairs = records.training_index_seed_pairs(records.sampler_weights(train_chains), 1, batch, batch,
                                                  records.training_sampler_seed(launched.seed))
        samples = Samples(train_chains, pairs, layout, index, TR.template_source(chains, layout, dc, "train"), dc,
                          "train")
        whole = next(batches(loader(samples, batch, 0)))   # every recycling iteration, on the host
    trainer = Trainer(cfg, launched, None)
    schedule = TR.RecyclingSchedule(TR.training_dataloader_seed(launched.seed), dc.num_recycling_iters,
                                    t["gradient_accumulation_iters"])
    on_device: dict[int, dict] = {}

    def steps(n):
        for _ in range(n):
            cut = schedule(whole)
            k = schedule.num_recycling_iters
            if k not in on_device:
                on_device[k] = to_device(cut, launched.device)
            trainer.step(on_device[k])
    steps.trainer = trainer
    steps.period = (dc.num_recycling_iters + 1) * t["gradient_accumulation_iters"]
    steps.note = (f"crop {dc.crop_size}, {cfg['model']['evoformer_stack']['num_blocks']} Evoformer blocks, "
                  f"recycling 0-{dc.num_recycling_iters} drawn per step, each once a period")
    return steps


def reference_deepcam_step(reference: str, cfg: dict, batch: int, gen):
    """The reference's step as its trainer runs it (mlcommons/hpc@2c627d4
    deepcam/src/deepCam/driver/trainer.py:40-71): forward, CELoss, backward, optimizer
    step, zero_grad, with cudnn.benchmark as its train.py:80 sets it."""
    import torch
    sys.path.insert(0, str(Path(reference) / "deepcam" / "src" / "deepCam"))
    from architecture.deeplab_xception import DeepLabv3_plus
    from utils.losses import CELoss
    torch.backends.cudnn.benchmark = True
    net = DeepLabv3_plus(n_input=16, n_classes=3, os=16, pretrained=False, _print=False).cuda()
    weights = [f ** -0.125 for f in cfg["train"]["class_frequencies"]]
    criterion = torch.jit.script(CELoss(weights)).cuda()
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01)
    net.train()
    x, y = _device_batch(cfg, "deepcam", batch, gen, torch.device("cuda"), torch.contiguous_format)

    def steps(n):
        for _ in range(n):
            loss = criterion(net(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
    return steps


# ---------------------------------------------------------------- the parts (parent)

class Check:
    def __init__(self, work: Path, dry: bool, reference: str | None, everything: bool = False):
        self.work, self.dry, self.reference, self.everything = work, dry, reference, everything
        self.rows: list[dict] = []
        self.steps: list[dict] = []
        self.e2e: dict[tuple, dict] = {}
        self.datasets: dict[str, Path] = {}

    def row(self, part: str, case: str, status: str, figures: str = "") -> None:
        r = {"part": part, "case": case, "status": status, "figures": figures}
        self.rows.append(r)
        print(f"{part:9s} {case:44s} {status:8s} {figures}", flush=True)

    def device(self) -> str:
        return "cpu" if self.dry else "cuda"

    # -- step
    def part_step(self) -> None:
        for bench in STEP_BENCHMARKS:   # OpenFold last: the longest step, the least needed figure
            warmup, steps, runs = (1, 1, 1) if self.dry else (5, 6, 3)
            limit = None
            if bench == "openfold":   # whole periods of its recycling draws (the child rounds up):
                # one period (4 steps at the reference) of warm-up, 2 timed periods, not 3
                warmup, steps, runs = 1, 1, (1 if self.dry else 2)
                limit = OPENFOLD_STEP_LIMIT_S
            log = self.work / f"step-{bench}.log"
            cmd = [sys.executable, __file__, "--child-step", bench, "--warmup", str(warmup), "--steps", str(steps),
                   "--runs", str(runs),
                   *(["--dry"] if self.dry else []), *(["--reference", self.reference] if self.reference else []),
                   *(["--all-steps"] if self.everything else [])]
            results = []
            with open(log, "w") as out, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=out, text=True,
                                                         env=kit_env(), cwd=REPO) as proc:
                timer = threading.Timer(limit, proc.kill) if limit else None
                if timer:
                    timer.start()
                try:
                    for line in proc.stdout:   # each case's row as soon as it is measured
                        out.write(line)
                        if line.startswith(RESULT):
                            results.append(json.loads(line[len(RESULT):]))
                            self._step_row(bench, results[-1])
                finally:
                    if timer:
                        timer.cancel()
            if proc.returncode != 0:
                why = f"killed after {limit:.0f} s" if limit and proc.returncode == -9 else f"exit {proc.returncode}"
                self.row("step", bench, "ERROR", f"{why}: {tail(log)}")

    def _step_row(self, bench: str, r: dict) -> None:
        if True:   # one measured case
            self.steps.append(r)
            if r["status"] != "ok":
                self.row("step", f"{bench} {r['label']}", r["status"].upper(), r.get("reason", "")[:160])
                return
            mem = f", peak {r['peak_gpu_gib']:.1f} GiB" if r.get("peak_gpu_gib") is not None else ""
            how = (f" ({r['memory_format']}, {'graph' if r['cuda_graph'] else 'eager'})"
                   if "cuda_graph" in r else "")
            self.row("step", f"{bench} {r['label']}{how}", "ok",
                     f"{r['samples_per_s']:.1f} samples/s, {r['seconds_per_step'] * 1e3:.1f} ms/step{mem}"
                     + (f" ({r['note']})" if r.get("note") else "")
                     + (f" [capture failed: {r['graph_error'][:100]}]" if r.get("graph_error") else ""))

    # -- data
    def dataset(self, bench: str, size: str) -> Path:
        """mini datasets as `hpckit datagen --config mini`; full ones: a few distinct full-size
        samples hard-linked to enough names for a few hundred steps. OpenFold at either size:
        one training chain and one validation target (its e2e run's data set: the sampler draws
        every step's sample from the training chains there are, each with its own seed; its
        layout is shards behind one index, nothing to hard-link)."""
        key = f"{bench}-{size}"
        if key in self.datasets:
            return self.datasets[key]
        root = self.work / "data" / key
        if bench == "openfold":
            proc = run(hpckit("datagen", bench, "--out", root, "--config", "mini" if size == "mini" else "reference",
                              "--train", 1, "--valid", 1), self.work / f"datagen-{key}.log", 600)
        elif size == "mini":
            proc = run(hpckit("datagen", bench, "--out", root, "--config", "mini"), self.work / f"datagen-{key}.log", 600)
        elif bench == "oc20":   # structures are small: as many distinct ones as the runs read
            proc = run(hpckit("datagen", bench, "--out", root, "--config", "reference", "--train", 256, "--valid", 16),
                       self.work / f"datagen-{key}.log", 900)
        else:
            distinct = root.with_name(key + "-distinct")
            proc = run(hpckit("datagen", bench, "--out", distinct, "--config", "reference", "--train", 16, "--valid", 4),
                       self.work / f"datagen-{key}.log", 900)
            if proc.returncode == 0:
                for split, n in (("train", 128), ("validation", 8)):
                    files = sorted(p for p in (distinct / split).iterdir() if p.is_file())
                    (root / split).mkdir(parents=True)
                    for i in range(n):
                        src = files[i % len(files)]
                        os.link(src, root / split / f"{'data-' if bench == 'deepcam' else ''}{i:05d}-{src.name}")
                if (distinct / "stats.h5").exists():
                    os.link(distinct / "stats.h5", root / "stats.h5")
        if proc.returncode != 0:
            raise RuntimeError(f"hpckit datagen {bench} failed: {tail(self.work / f'datagen-{key}.log')}")
        self.datasets[key] = root
        return root

    # -- e2e
    def part_e2e(self) -> None:
        from hpckit.results.analysis import run_facts
        from hpckit.results.logs import _records
        runs = [("cosmoflow", 1, "fp32", ["data.stage_decode=true"]), ("deepcam", 2, "fp32", []),
                ("openfold", 1, "fp32", openfold_e2e_sets("mini"))] if self.dry else E2E_RUNS
        for bench, batch, prec, extra in runs:
            label = f"{bench} {prec} b{batch} from files"
            name = f"e2e-{bench}-{prec}-b{batch}"
            out = self.work / name
            try:
                data = self.dataset(bench, "mini" if self.dry else "full")
            except RuntimeError as e:
                self.row("e2e", label, "ERROR", str(e))
                continue
            if bench == "openfold":   # the data set's chains (dataset()); its cycles are in `extra`
                n_train, n_valid, limits = 1, 1, []
            else:
                n_train, n_valid = (8, 4) if self.dry else (256, 16) if bench == "oc20" else (128, 8)
                limits = [f"train.max_steps={E2E_EPOCHS * (n_train // batch)}", "train.n_epochs=1000"]
            sets = [*extra, f"data.batch_size={batch}", f"data.n_train={n_train}", f"data.n_valid={n_valid}",
                    *limits, f"train.precision={prec}"]
            cmd = hpckit("train", bench, "--data", data, "--config", "mini" if self.dry else "reference",
                         "--output-dir", out, "--seed", 1, "--device", self.device(),
                         *(["--framework", "pytorch"] if bench == "cosmoflow" else []),
                         *(["--stage-dir", self.work / f"stage-{name}"] if bench == "cosmoflow" else []),
                         # OpenFold's mini model on the CPU: one thread, as its step case (above: 2 threads
                         # beside other tests took 1.9 s a step on the 2-core VM, one thread 75 ms)
                         *(["--threads", 1] if self.dry and bench == "openfold" else []),
                         *(x for s in sets for x in ("--set", s)))
            proc = run(cmd, self.work / f"{name}.log",
                       timeout=OPENFOLD_E2E_LIMIT_S if bench == "openfold" and not self.dry else 900)
            s = summary(out)
            if proc.returncode not in (0, 3) or not s.get("train_samples_per_s"):
                self.row("e2e", label, "ERROR", tail(self.work / f"{name}.log"))
                continue
            try:
                f = run_facts(out / "mlperf.log", "site")
            except Exception as e:   # the kit's own log unreadable: a row, not the end of the table
                self.row("e2e", label, "ERROR", f"{out / 'mlperf.log'}: {e}")
                continue
            u, cores = s.get("usage") or {}, s.get("cores") or {}
            later = f.cycles_s[1:-1] or f.cycles_s[1:]   # epoch start to the next: training, evaluation, the rest
            # the run's timeline as analyze reads it (hpckit/results/timeline.py): OpenFold's
            # train/eval cycles' samples are its epoch_num's growth, their time the training
            # time of each cycle, as an epoch's for the others
            times = f.cycle_times if f.no_epochs else f.epoch_times
            sustained, first_s = f.steady_throughput, (times[0] if times else None)
            per_cycle = f.train_samples / f.cycles_per_epoch if f.train_samples and f.cycles_per_epoch else None
            r = {"sustained": sustained, "first_epoch_s": first_s,
                 "whole": s["train_samples_per_s"], "with_eval": per_cycle / statistics.median(later)
                 if later and per_cycle else None, "input_wait": u.get("input_wait_share"),
                 "gpu_busy": u.get("gpu_busy_share"), "gpu_energy_j": u.get("gpu_energy_j"),
                 "gpu_power_w": u.get("gpu_power_w"), "workers": cores.get("loader_workers"),
                 "staging_s": s.get("staging_s"), "epochs": s.get("epochs")}
            # the step inside the run, over the epochs after the first (as the sustained rate):
            # the samples over the steps' GPU time, i.e. the sustained rate over the epochs'
            # GPU busy share (hpckit_epoch_usage); the first epoch's autotuning and capture
            # keep the GPU busy with other work than the steps
            # (after the first record: OpenFold's epoch_num counts samples, the others' epochs from 1)
            busy = [rec["value"].get("gpu_busy_share") for rec in _records(out / "mlperf.log")
                    if rec.get("key") == "hpckit_epoch_usage" and isinstance(rec.get("value"), dict)][1:]
            busy = [b for b in busy if isinstance(b, (int, float)) and b > 0]
            if busy and r["sustained"]:
                r["gpu_busy_sustained"] = statistics.median(busy)
                r["step_in_run"] = r["sustained"] / r["gpu_busy_sustained"]
            self.e2e[(bench, prec, batch)] = r
            fmt = lambda v, spec: "n/a" if v is None else format(v, spec)   # noqa: E731
            epoch = "cycle" if f.no_epochs else "epoch"   # OpenFold's train/eval cycles (summary.json's epochs)
            self.row("e2e", label, "ok",
                     f"{fmt(r['sustained'], '.1f')} samples/s sustained (median of {epoch}s 2-{r['epochs']}), "
                     f"{fmt(r['with_eval'], '.1f')} with evaluation, first {epoch} {fmt(r['first_epoch_s'], '.1f')} s, "
                     f"whole run {r['whole']:.1f}; input wait {fmt(r['input_wait'], '.2f')}, GPU busy "
                     f"{fmt(r['gpu_busy'], '.2f')}"
                     + (f" ({r['gpu_busy_sustained']:.2f} after the first {epoch}: the step in the run "
                        f"{r['step_in_run']:.1f} samples/s)" if r.get("step_in_run") else "")
                     + f", {r['workers']} loader workers, staging {r['staging_s'] or 0:.1f} s"
                     + (f", GPU {r['gpu_energy_j'] / 1e3:.1f} kJ at {r['gpu_power_w']:.0f} W" if r["gpu_energy_j"]
                        and r["gpu_power_w"] else "")
                     + graph_note(self.work / f"{name}.log"))

    # -- mini trainings, in parallel
    def part_mini(self) -> None:
        runs = []
        kinds = (("deterministic", True), ("deterministic-again", True), ("default", False))
        # Not OpenFold: its mini training to the target takes about 2 min 10 s on 2 CPU cores and
        # has not been timed on a GPU; three more of them (deterministic twice, and without)
        # would likely cost more than the minute of the session's GPU time this part can spare.
        # The reframe part trains it once, to the target, --deterministic, and has it checked.
        for bench in ("cosmoflow", "deepcam"):
            data = self.dataset(bench, "mini")
            for name, det in kinds[:1] if self.dry and bench == "cosmoflow" else kinds:
                out = self.work / f"mini-{bench}-{name}"
                cmd = hpckit("train", bench, "--data", data, "--config", "mini", "--output-dir", out, "--seed", 7,
                             "--device", self.device(), "--threads", 2, "--set", "data.loader_workers=2",
                             *(["--framework", "pytorch"] if bench == "cosmoflow" else []),
                             *(["--deterministic"] if det else []),
                             *(["--set", "train.max_steps=2", "--set", "data.n_valid=8"] if self.dry else []))
                runs.append((bench, name, out, cmd))
        with concurrent.futures.ThreadPoolExecutor(len(runs)) as pool:
            procs = list(pool.map(lambda r: run(r[3], self.work / f"{r[2].name}.log", 1200), runs))
        curves = {}
        for (bench, name, out, _), proc in zip(runs, procs):
            s = summary(out)
            if proc.returncode not in (0, 3) or not s:
                self.row("mini", f"{bench} {name}", "FAIL", tail(self.work / f"{out.name}.log"))
                continue
            verdict = run(hpckit("check", out / "mlperf.log", "--ruleset", "mini", "--config", "mini"),
                          self.work / f"check-{out.name}.log", 300)
            compliant = verdict.returncode == 0
            curves[(bench, name)] = [l.split('"value": ')[1].split(",")[0] for l in
                                     (out / "mlperf.log").read_text().splitlines() if f'"key": "{s["metric"]}"' in l]
            ok = (s.get("converged") and compliant) or self.dry
            self.row("mini", f"{bench} {name}", "PASS" if ok else "FAIL",
                     f"{'converged' if s.get('converged') else 'NOT converged'} in {s.get('epochs')} epochs, "
                     f"{s.get('final_' + s.get('metric', ''), float('nan')) or float('nan'):.4f}, "
                     f"{'COMPLIANT' if compliant else 'NOT COMPLIANT'}, "
                     f"{s.get('train_samples_per_s') or 0:.1f} samples/s" + graph_note(self.work / f"{out.name}.log"))
        for bench in ("cosmoflow", "deepcam"):
            a, b = curves.get((bench, "deterministic")), curves.get((bench, "deterministic-again"))
            if a is not None and b is not None:
                self.row("mini", f"{bench} deterministic twice: same curve", "PASS" if a == b else "FAIL",
                         f"{len(a)} evaluations, {'identical' if a == b else 'differ: ' + str(a) + ' vs ' + str(b)}")

    # -- torchrun
    def part_torchrun(self) -> None:
        out = self.work / "torchrun-deepcam"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1", "-m", "hpckit",
               "train", "deepcam", "--data", self.dataset("deepcam", "mini"), "--config", "mini", "--output-dir", out,
               "--seed", 7, "--dist", "torch", "--device", self.device(), "--threads", 2,
               "--set", "data.loader_workers=2",
               *(["--set", "train.max_steps=2", "--set", "data.n_valid=8"] if self.dry else [])]
        run(cmd, self.work / "torchrun.log", 900)
        s = summary(out)   # (torchrun exits 1 for a rank's 3, not converged: the summary says which)
        ok = s.get("dist") == "torch" and (s.get("converged") or (self.dry and s.get("epochs") == 1))
        self.row("torchrun", "deepcam mini, 1 rank, torch.distributed", "PASS" if ok else "FAIL",
                 f"dist {s.get('dist')}, {'converged' if s.get('converged') else 'NOT converged'} in "
                 f"{s.get('epochs')} epochs" if s else tail(self.work / "torchrun.log"))

    # -- reframe
    def part_reframe(self) -> None:
        bindir = self.work / "bin"
        bindir.mkdir(exist_ok=True)
        wrapper = bindir / "hpckit"
        wrapper.write_text(f"#!/bin/sh\nexec {sys.executable} -m hpckit \"$@\"\n")
        wrapper.chmod(0o755)
        env = kit_env()
        env["PATH"] = f"{bindir}:{env.get('PATH', '')}"
        # OpenFold's check runs as the others do (its mini training to the target, --deterministic,
        # then `hpckit check`), last: the local profile runs one check at a time, so it adds its
        # whole time to the part. Not timed on a GPU yet; on 2 CPU cores it reached the target in
        # about 2 min 10 s (reframe_checks/openfold.py). The part runs beside mini and torchrun,
        # which took 46 s on the GPU of 2026-11-26, the other three checks 96 s (bench/README.md):
        # the command's wall time grows by OpenFold's check; the part's 1500 s limit stays.
        files = [REPO / "reframe_checks" / f for f in ("cosmoflow.py", "deepcam.py", "oc20.py", "openfold.py")
                 if (REPO / "reframe_checks" / f).exists()]
        names = ["CosmoFlowCheck%framework=pytorch", "DeepCAMCheck", "OC20Check", "OpenFoldCheck"]
        cmd = [sys.executable, "-c", "import sys; from reframe.frontend.cli import main; sys.argv[0] = 'reframe'; "
                                     "sys.exit(main())",
               "-C", REPO / "site_profiles" / "local" / "settings.py", *(x for f in files for x in ("-c", f)),
               *(x for n in names for x in ("-n", n)), "--prefix", self.work / "reframe",
               "--perflogdir", self.work / "reframe" / "perflogs", "--nocolor", "--dry-run" if self.dry else "-r"]
        log = self.work / "reframe.log"
        proc = run([str(c) for c in cmd], log, 1500, env=env)
        text = log.read_text(errors="replace")
        lines = text.splitlines()
        import re
        current = None
        for line in lines:   # "[       OK ] (2/2) DeepCAMCheck %framework=pytorch /f2d4 @...", then its "P: " lines
            m = re.match(r"^\[\s*(OK|FAIL|DRY)\s*\]\s*(\(\d+/\d+\)\s*)?(.*?)\s+/[0-9a-f]+", line)
            if m and not (self.dry and m.group(1) == "OK"):   # --dry-run says DRY, then OK, per test
                status = {"OK": "PASS", "FAIL": "FAIL", "DRY": "DRY"}[m.group(1)]
                current = {"part": "reframe", "case": m.group(3)[:44], "status": status, "figures": ""}
                self.rows.append(current)
            elif line.startswith("P: ") and current is not None and current["status"] == "PASS":
                name, _, value = line[3:].partition(":")
                if name.strip() in ("time_to_train", "train_throughput", "epochs"):
                    value = value.strip().split(" (r:")[0]
                    current["figures"] += ("; " if current["figures"] else "") + f"{name.strip()} {value}"
        for r in self.rows:
            if r["part"] == "reframe" and r is not None:
                print(f"{r['part']:9s} {r['case']:44s} {r['status']:8s} {r['figures']}", flush=True)
        summary_line = next((l for l in reversed(lines) if "PASSED" in l or "FAILED" in l or "Ran " in l), "")
        ok = proc.returncode == 0
        self.row("reframe", "local profile, GPU checks" + (" (--dry-run)" if self.dry else ""),
                 "PASS" if ok else "FAIL", summary_line.strip()[:160] or tail(log))

    # -- the targets
    def targets(self) -> None:
        ok = {(r["benchmark"], r["who"], r["precision"], r["batch"]): r["samples_per_s"]
              for r in self.steps if r["status"] == "ok"}
        if self.dry:
            return
        for batch in sorted({b for (bench, who, _, b) in ok if bench == "deepcam"}):
            ref = ok.get(("deepcam", "reference", "fp32", batch))
            kit32 = ok.get(("deepcam", "kit", "fp32", batch))
            best = max((v for (bench, who, _, b), v in ok.items() if bench == "deepcam" and who.startswith("kit")
                        and b == batch), default=None)
            if ref and kit32:
                self.row("target", f"deepcam b{batch}: kit fp32 >= reference fp32", "PASS" if kit32 >= ref else "FAIL",
                         f"{kit32:.1f} vs {ref:.1f} samples/s ({kit32 / ref:.2f}x)")
            if ref and best:
                self.row("target", f"deepcam b{batch}: kit fastest >= 1.5x reference", "PASS" if best >= 1.5 * ref
                         else "FAIL", f"{best:.1f} vs {ref:.1f} samples/s ({best / ref:.2f}x)")
            nv = NVIDIA_H100.get(("deepcam", batch))
            if nv and best:
                self.row("target", f"deepcam b{batch}: kit fastest >= NVIDIA v3.0 H100", "PASS" if best >= nv else "FAIL",
                         f"{best:.1f} vs {nv:.0f} samples/s")
        best_cf = max((v for (bench, who, _, b), v in ok.items() if bench == "cosmoflow" and b == 1), default=None)
        if best_cf:
            self.row("target", "cosmoflow b1: kit fastest >= NVIDIA v3.0 H100",
                     "PASS" if best_cf >= NVIDIA_H100[("cosmoflow", 1)] else "FAIL",
                     f"{best_cf:.1f} vs {NVIDIA_H100[('cosmoflow', 1)]:.0f} samples/s")
        for (bench, prec, batch), r in self.e2e.items():
            step = ok.get((bench, "kit", prec, batch))
            where = "the step alone"
            if step is None and r.get("step_in_run"):
                step, where = r["step_in_run"], "the step in the run"
            if step and r["sustained"]:
                self.row("target", f"{bench} {prec} b{batch}: from files >= {FEED_TARGET}x the step",
                         "PASS" if r["sustained"] >= FEED_TARGET * step else "FAIL",
                         f"{r['sustained']:.1f} samples/s from files, {where} {step:.1f} ({r['sustained'] / step:.2f}x)")
            nv = NVIDIA_H100_E2E.get((bench, batch))
            if nv and r["with_eval"] and prec != "fp32" and self.h100:
                self.row("target", f"{bench} b{batch}: with evaluation >= NVIDIA v3.0 H100",
                         "PASS" if r["with_eval"] >= nv else "FAIL",
                         f"{r['with_eval']:.1f} vs {nv:.1f} samples/s per GPU (epochs with evaluation)")


def header(dry: bool) -> str:
    import torch
    gpu = "none"
    if torch.cuda.is_available() and not dry:
        p = torch.cuda.get_device_properties(0)
        gpu = f"{p.name} ({p.total_memory / 2 ** 30:.0f} GiB, sm {p.major}.{p.minor})"
    cuda = torch.version.cuda or "cpu-only"
    return (f"# gpu_check host {platform.node()}, {os.cpu_count()} CPUs, {cpu_model()} flags {cpu_flags()}, "
            f"GPU {gpu}, torch {torch.__version__} (CUDA {cuda}), python {platform.python_version()}"
            f"{', DRY RUN on the CPU' if dry else ''}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reference", help="your clone of mlcommons/hpc (the reference's DeepCAM step)")
    p.add_argument("--dry", action="store_true", help="every part on the CPU at tiny sizes (CI)")
    p.add_argument("--parts", default=",".join(PARTS))
    p.add_argument("--out", help="also write the table (gpu_check.txt) and the figures (gpu_check.json) here "
                                 "(a directory that holds neither yet)")
    p.add_argument("--workdir", help="where datasets and runs go: a new directory inside it (default: a new "
                                     "temporary directory)")
    p.add_argument("--keep", action="store_true", help="keep the work directory")
    p.add_argument("--all-steps", action="store_true", help="the step part's bf16 and contiguous + eager cases too")
    p.add_argument("--child-step", help=argparse.SUPPRESS)
    p.add_argument("--warmup", type=int, default=6, help=argparse.SUPPRESS)
    p.add_argument("--steps", type=int, default=10, help=argparse.SUPPRESS)
    p.add_argument("--runs", type=int, default=3, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    parts = [x for x in args.parts.split(",") if x]
    if any(x not in PARTS for x in parts):
        bad(f"--parts {args.parts}: choose from {', '.join(PARTS)}")
    if args.reference and not (Path(args.reference) / "deepcam" / "src" / "deepCam" / "architecture"
                               / "deeplab_xception.py").is_file():
        bad(f"--reference {args.reference}: not a clone of mlcommons/hpc (no deepcam/src/deepCam/architecture/"
            "deeplab_xception.py)")
    if args.child_step:
        sys.path.insert(0, str(REPO / "apps"))
        run_step_child(args.child_step, args.dry, args.reference, args.warmup, args.steps, args.all_steps, args.runs)
        return 0
    out = Path(args.out) if args.out else None
    if out is not None:   # before any work: a table is never written over one this run did not write
        if out.exists() and not out.is_dir():
            bad(f"--out {out}: not a directory")
        taken = [n for n in ("gpu_check.txt", "gpu_check.json") if (out / n).exists() or (out / n).is_symlink()]
        if taken:
            bad(f"--out {out}: already holds {' and '.join(taken)} (an earlier check's: name another directory)")
        check_writable("gpu_check", "--out", out, out)   # a read-only one: now, not after the check
    if args.workdir:
        base = Path(args.workdir)
        if base.exists() and not base.is_dir():
            bad(f"--workdir {base}: not a directory")
    try:
        import torch
    except ImportError:
        bad("PyTorch is not importable by this python")
    if not args.dry and not torch.cuda.is_available():
        bad("no CUDA device is visible (--dry checks the command on the CPU)")
    for module in ("h5py", "mlperf_logging", "yaml", "crc32c") + (("reframe",) if "reframe" in parts else ()):
        try:
            __import__(module)
        except ImportError:
            bad(f"{module} is not importable: install the kit's wheels (make gpu-wheels, then pip install .whl/*)")
    sys.path.insert(0, str(REPO / "apps"))
    try:
        if args.workdir:   # ours: a new directory inside it; what else it holds is not ours
            Path(args.workdir).mkdir(parents=True, exist_ok=True)
            work = Path(tempfile.mkdtemp(prefix="hpckit-gpu-check-", dir=args.workdir))
        else:
            work = Path(tempfile.mkdtemp(prefix="hpckit-gpu-check-"))
    except OSError as e:
        bad(f"--workdir {args.workdir}: cannot create a directory there ({e.strerror or e})")
    print(header(args.dry), flush=True)
    print(f"{'part':9s} {'case':44s} {'status':8s} figures", flush=True)
    check = Check(work, args.dry, args.reference, args.all_steps)
    check.h100 = not args.dry and "H100" in torch.cuda.get_device_name(0)
    started = time.perf_counter()

    def run_part(part: str) -> None:
        try:
            getattr(check, f"part_{part}")()
        except Exception as e:   # one broken part is a row, the others still run
            check.row(part, "(the part)", "ERROR", f"{type(e).__name__}: {e}"[:200])

    for part in ("e2e", "step"):          # timed: alone on the machine; the whole path first
        if part in parts:
            run_part(part)
    together = [part for part in ("mini", "torchrun", "reframe") if part in parts]   # correctness: at once
    if {"mini", "torchrun"} & set(together):
        for bench in ("cosmoflow", "deepcam"):
            try:
                check.dataset(bench, "mini")
            except RuntimeError as e:
                check.row("data", f"{bench} mini", "ERROR", str(e))
    with concurrent.futures.ThreadPoolExecutor(max(1, len(together))) as pool:
        list(pool.map(run_part, together))
    check.targets()
    order = {part: i for i, part in enumerate((*PARTS, "data", "target"))}
    check.rows.sort(key=lambda r: order.get(r["part"], 99))
    print("\n| part | case | status | figures |\n|---|---|---|---|", flush=True)
    for r in check.rows:
        print(f"| {r['part']} | {r['case']} | {r['status']} | {r['figures']} |", flush=True)
    failed = [r for r in check.rows if r["status"] in ("FAIL", "ERROR")]
    print(f"# {len(check.rows)} rows, {len(failed)} failed, {time.perf_counter() - started:.0f} s; work {work}",
          flush=True)
    if out is not None:
        from hpckit.common.errors import KitError
        from hpckit.common.fileio import atomic_write_text
        table = "\n".join([header(args.dry)] + [f"| {r['part']} | {r['case']} | {r['status']} | {r['figures']} |"
                                                 for r in check.rows])
        e2e = [{"benchmark": b, "precision": q, "batch": n, **r} for (b, q, n), r in check.e2e.items()]
        try:
            out.mkdir(parents=True, exist_ok=True)
            atomic_write_text(out / "gpu_check.txt", table + "\n", "--out")
            atomic_write_text(out / "gpu_check.json", json.dumps({"rows": check.rows, "steps": check.steps,
                                                                   "e2e": e2e, "seconds": time.perf_counter() - started},
                                                                  indent=1), "--out")
        except (OSError, KitError) as e:
            print(f"gpu_check: --out {out}: {e}", file=sys.stderr, flush=True)
            failed = failed or [True]
    if not (args.keep or failed):
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
