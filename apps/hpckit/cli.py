"""The `hpckit` command: one entry point dispatching to the benchmark and results code.

Heavy frameworks (TensorFlow, PyTorch) are imported only by the subcommand that needs them.
Bad input surfaces as `KitError`: one line on stderr, exit code 2.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import importlib
import os
import sys

from hpckit.common.benchmark import PACKAGES, descriptors
from hpckit.common.dist import DIST_CHOICES
from hpckit.common.errors import EXIT_INTERRUPTED, EXIT_TERMINATED, EXIT_USAGE, KitError, Terminated, disk_error, \
    is_disk_error
from hpckit.common.fileio import begin_command, output_dir, output_file
from hpckit.common.inputs import cli_float, cli_int

BENCHMARKS = PACKAGES   # one package, one descriptor each (hpckit/common/benchmark.py)
# Subcommands that own their arguments: module.add_arguments(parser) and module.main(args).
# The modules import their heavy dependencies (matplotlib, spython) inside main().
TOOL_COMMANDS = {
    "package": ("hpckit.results.package", "lay runs out as an MLPerf HPC submission package"),
    "report": ("hpckit.results.report", "write the time-to-solution report (index.html + PNG plots)"),
    "containers": ("hpckit.containers.generate", "generate the Apptainer and Docker files of every target"),
    "references": ("hpckit.results.references", "calibrate a system's performance references from its perflogs"),
    "analyze": ("hpckit.results.analysis", "take runs apart (init, staging, epochs, evaluation, throughput per "
                                            "unit) and fit the epochs-to-converge record"),
    "project": ("hpckit.results.project", "project the time to train at N units from measured runs and the "
                                          "convergence record (or --validate it on published rounds)"),
}
RULESETS = ("hpc-1.0.0", "hpc-2.0.0", "hpc-3.0.0", "mini")


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is ONE line on stderr (the kit's rule for bad input),
    exit code 2; `hpckit ... --help` still prints the full usage."""

    def error(self, message: str):
        self.exit(EXIT_USAGE, f"{self.prog}: error: {' '.join(message.split())} (see {self.prog} --help)\n")


seed_value = cli_int(0, 2 ** 31 - 1)   # --seed: what every framework's generator takes
positive_int = cli_int(1, 2 ** 31 - 1)  # counts of samples, threads, instances: a C int's range


def _add_config(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default="mini",
                   help="mini | reference | a YAML file of overrides (default: mini)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override one config value, e.g. --set lr_schedule.base_lr=0.02")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="hpckit", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("datagen", help="write a synthetic dataset in the benchmark's on-disk format")
    p.add_argument("benchmark", choices=BENCHMARKS)
    p.add_argument("--out", required=True, type=output_dir("--out", "run"),
                   help="dataset root (train/ and validation/ go under it): a new or empty directory")
    p.add_argument("--config", default=None,
                   help="take counts and sample size from this training config (mini | reference | FILE)")
    p.add_argument("--train", type=positive_int, default=None, help="training samples")
    p.add_argument("--valid", type=positive_int, default=None, help="validation samples")
    p.add_argument("--size", type=positive_int, default=None, help="cosmoflow: cube side S (default 128, or the config's)")
    p.add_argument("--height", type=positive_int, default=None,
                   help="deepcam: grid rows (default 768, or the config's)")
    p.add_argument("--width", type=positive_int, default=None,
                   help="deepcam: grid columns (default 1152, or the config's)")
    p.add_argument("--seed", type=seed_value, default=0)
    p.add_argument("--format", choices=("tfrecord", "npy"), default="tfrecord", help="cosmoflow only")
    p.add_argument("--shuffle-labels", action="store_true",
                   help="sabotage: permute the targets across samples (for checks that must fail)")
    p.add_argument("--workers", type=positive_int, default=None, help="generator processes (default: all cores)")

    p = sub.add_parser("train", help="train a benchmark and write OUT/mlperf.log and OUT/summary.json")
    p.add_argument("benchmark", choices=BENCHMARKS)
    p.add_argument("--data", required=True,
                   help="the dataset's root, laid out as the public one: " + "; ".join(
                       f"{name}: {d.data_layout}" for name, d in descriptors().items()))
    p.add_argument("--output-dir", required=True, type=output_dir("--output-dir", "run"),
                   help="the run's directory (created; never one holding an earlier run's results)")
    _add_config(p)
    p.add_argument("--framework", choices=("auto", "tensorflow", "pytorch"), default="auto",
                   help="cosmoflow: auto (TensorFlow on AVX-512 CPUs, else PyTorch), tensorflow or "
                        "pytorch; deepcam: pytorch (as the reference)")
    p.add_argument("--stage-dir", default=None,
                   help="node-local directory to stage the data into (into a new hpckit-stage-* subdirectory "
                        "the run creates and removes at the end)")
    p.add_argument("--keep-staged", action="store_true", help="keep the staged copies after the run")
    p.add_argument("--deterministic", action="store_true",
                   help="deterministic kernels and data order: the same seed gives the same curve and epochs "
                        "(config key train.deterministic; the regression checks use it)")
    p.add_argument("--seed", type=seed_value, default=None, help="default: derived from the clock, logged")
    p.add_argument("--threads", type=positive_int, default=None, help="intra-op threads (default: all cores)")
    p.add_argument("--allocator", choices=("auto", "tcmalloc", "glibc"), default="auto",
                   help="memory allocator of the training process: tcmalloc (preloaded; auto: when installed, "
                        "else glibc with fixed thresholds), logged (common/memory.py)")
    p.add_argument("--dist", choices=DIST_CHOICES, default="auto",
                   help="communicator for several ranks: auto (torch for PyTorch, tf for TensorFlow; none "
                        "for one rank), torch, tf, horovod, none")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="PyTorch device: the local rank's GPU when CUDA is available (auto), or cpu")
    # finite and at most 10^7 s here (a timedelta of 1e308 s overflows); > 0 is checked with the
    # launch (common/run.py), whose message names the value
    p.add_argument("--collective-timeout", type=cli_float(-sys.float_info.max, 10 ** 7), default=60.0,
                   metavar="SECONDS",
                   help="a collective waiting longer for a peer fails the run (default 60)")
    p.add_argument("--checkpoint", default=None, metavar="FILE",
                   help="openfold: start from these parameters (the reference's --initialize_parameters_from: a "
                        "state_dict, or a resumable checkpoint with the optimizer's state); its sha256 is logged")
    p.add_argument("--instances", type=positive_int, default=1, metavar="M",
                   help="a throughput campaign: the launch's ranks form M model instances of equal size, "
                        "each trained on its own (own seed, communicator, OUT/instance_<i>/), all starting together")

    p = sub.add_parser("describe", help="print a benchmark's model: layers, output shape, parameters")
    p.add_argument("benchmark", choices=BENCHMARKS)
    _add_config(p)
    p.add_argument("--framework", choices=("auto", "tensorflow", "pytorch"), default="auto")

    p = sub.add_parser("check", help="run the official MLPerf compliance checker on a result log")
    p.add_argument("log")
    p.add_argument("--ruleset", choices=RULESETS, default="hpc-3.0.0")
    p.add_argument("--config", default="mini",
                   help="with --ruleset mini: the training config whose target applies (default: mini)")

    p = sub.add_parser("score", help="score MLPerf result sets as the official summarizer does "
                                     "(strong: olympic mean; weak: models, instance scale, time_to_train_all)")
    p.add_argument("paths", nargs="+", metavar="PATH",
                   help="result logs and/or directories: a submission tree (<org>/results/<system>/"
                        "strong|weak/<benchmark>/, or a folder of orgs), or a bare folder of logs")
    p.add_argument("--scaling", choices=("strong", "weak"), default=None,
                   help="for logs outside the submission layout: which scaling they are (the kit's own "
                        "runs are strong scaling)")
    p.add_argument("--ruleset", default=None, metavar="hpc-X.Y.Z",
                   help="also run the official compliance checker on each log, as the summarizer does; "
                        "a run it fails does not count")
    p.add_argument("--as-published", action="store_true",
                   help="the tree is a published round: apply the scaling.json each folder holds, as the "
                        "summarizer run on it does (default: the RCP factor the package checker would write)")
    p.add_argument("--json", default=None, metavar="FILE", type=output_file("--json"),
                   help="also write the scores as JSON (a new file)")

    for name, (module, help_text) in TOOL_COMMANDS.items():
        importlib.import_module(module).add_arguments(sub.add_parser(name, help=help_text))
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        code = run_command(argv)
    except BrokenPipeError:
        # the reader of stdout left early (`hpckit describe ... | head -n 1`): not an error
        # of the kit, and no traceback; stdout goes to /dev/null so the exit's flush is quiet
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = 128 + 13   # as a process killed by SIGPIPE, what shells report
    finally:
        campaign = getattr(sys.modules.get("hpckit.common.dist"), "ACTIVE_CAMPAIGN", None)
        if campaign is not None:
            # an instance that finished (converged, missed its target or failed) waits for the
            # others: its launcher would stop them all on its exit status (common/dist.py)
            missed = campaign.end_barrier()
            if missed:
                print(f"hpckit train: warning: {missed}", file=sys.stderr, flush=True)
    dist = sys.modules.get("hpckit.common.dist")    # loaded only where a run made a communicator
    if dist is not None and dist.UNSAFE_TEARDOWN:
        # results and logs are written and closed; skip the interpreter teardown that can
        # deadlock or abort in torch's gloo destructors (common/dist.py UNSAFE_TEARDOWN)
        dist.end_process(code)
    return code


@contextlib.contextmanager
def _stop_on_sigterm():
    """While a results command runs, a SIGTERM (a batch system ending the job) stops it as
    an exception, so what it was writing is taken back (a report or package half built is
    removed: common/fileio.py) before it exits 143; the handler that was there is put back
    after (main() may run in-process). `train` installs its own (common/dist.py)."""
    import signal
    import threading
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_DFL)    # a second one ends it at once
        raise Terminated("stopped by SIGTERM")
    before = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def run_command(argv: list[str] | None) -> int:
    begin_command()
    args = build_parser().parse_args(argv)
    try:
        if getattr(args, "allocator", None) is not None:
            # before anything else: the training restarts itself with tcmalloc preloaded
            from hpckit.common import memory
            memory.reexec_with_tcmalloc(sys.argv[1:] if argv is None else list(argv), args.allocator)
        if args.command == "check":
            from hpckit.common.compliance import main_check
            with _stop_on_sigterm():
                return main_check(args)
        if args.command == "score":
            from hpckit.results.score import main_score
            with _stop_on_sigterm():
                return main_score(args)
        if args.command in TOOL_COMMANDS:
            with _stop_on_sigterm():
                return importlib.import_module(TOOL_COMMANDS[args.command][0]).main(args)
        if args.command == "train" and args.checkpoint is not None:
            from hpckit.common.benchmark import descriptors
            if not descriptors()[args.benchmark].init_checkpoint:
                raise KitError(f"--checkpoint {args.checkpoint}: {args.benchmark} starts from its model's "
                               "initialisation, as its reference; no checkpoint is read")
        if args.command == "train" and args.instances > 1:
            from hpckit.common.run import campaign_output_dir
            args.output_dir = str(campaign_output_dir(args.output_dir, args.instances))
        module = importlib.import_module(f"hpckit.{args.benchmark}.commands")
        return getattr(module, args.command)(args)
    except Terminated as e:
        print(f"hpckit {args.command}: error: {e}", file=sys.stderr)
        return EXIT_TERMINATED
    except KitError as e:
        print(f"hpckit {args.command}: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"hpckit {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except OSError as e:
        if e.errno in (errno.ENAMETOOLONG, errno.ELOOP) and e.filename is not None:
            # a path given as input that the file system cannot even look up (Path.exists and
            # is_dir raise these where they return False for a missing file)
            print(f"hpckit {args.command}: error: {e.filename}: {e.strerror}", file=sys.stderr)
            return EXIT_USAGE
        if not is_disk_error(e):
            raise
        # a full or read-only file system met outside a place that names its file
        print(f"hpckit {args.command}: error: {disk_error(e)}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
