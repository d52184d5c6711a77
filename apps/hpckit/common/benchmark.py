"""Each benchmark's facts, in one descriptor per benchmark package (`DESCRIPTOR` in
hpckit/<package>/__init__.py for each of PACKAGES): the MLPerf name, the quality metric and
its direction, the official target and the config key holding the kit's, the official rules
the mini ruleset replaces, and how to count the network's FLOPs. The CLI, the training's quality test, the log
reader (score, package, report) and the compliance checker read them here, never from a
copy of their own.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

PACKAGES = ("cosmoflow", "deepcam", "oc20", "openfold")


@dataclass(frozen=True)
class RuleSubstitution:
    """One official rule expression whose constant comes from the training config instead
    (the mini ruleset, common/compliance.py).

    `files` are the official ruleset's files (all must hold the record), `key` the record's
    NAME, `field` the record field (CHECK, ATLEAST_ONE_CHECK), `official` the whole official
    expression (compared with whitespace normalised), `constant` the literal in it that is
    replaced, `config_key` the dotted path of the config value that replaces it.
    """

    files: tuple[str, ...]
    key: str
    field: str
    official: str
    constant: str
    config_key: str
    kind: type = float  # float: a positive finite number; int: a positive integer; str: a sha256
    #                     digest, 64 lower-case hex digits (the only strings substituted)


@dataclass(frozen=True)
class Benchmark:
    name: str                    # submission_benchmark
    metric: str                  # the MLPerf key of the quality metric
    higher_is_better: bool
    official_target: float       # the closed division's quality target
    target_key: str              # the config key holding the kit's target (mini: a substitution)
    mini_rules: tuple[RuleSubstitution, ...]   # official rules the mini ruleset rewrites
    # cfg -> (model, step): one training sample's forward + backward for the FLOP count
    # (common/flops.py); the function imports the framework itself, so a descriptor stays light
    flops_sample: Callable[[dict], tuple[object, Callable[[], object]]] | None = None
    # `hpckit train --checkpoint FILE` (the parameters to start from) is the benchmark's: its
    # reference starts from a checkpoint; the others refuse the option
    init_checkpoint: bool = False
    # why the benchmark's logs count no epochs (their epoch_num is something else; None: epochs)
    no_epochs: str | None = None
    # what `hpckit train --data DIR` holds for this benchmark (its public dataset's layout): the
    # command's help
    data_layout: str = "train/ and validation/"

    @property
    def comparison(self) -> str:
        return ">=" if self.higher_is_better else "<="


def descriptors() -> dict[str, Benchmark]:
    """name -> descriptor of every benchmark package (light imports: the packages'
    __init__ holds only the descriptor)."""
    return {name: importlib.import_module(f"hpckit.{name}").DESCRIPTOR for name in PACKAGES}
