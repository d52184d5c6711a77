"""`hpckit package`: lay result logs out as an MLPerf HPC submission package.

    hpckit package --site PROFILE --org NAME RUNS... --out DIR [--system NAME]
                   [--division closed|open] [--status onprem|cloud|preview|research|available]
                   [--benchmark cosmoflow|deepcam] [--system-json FILE]
                   [--check hpc-3.0.0|mini|...] [--seed-checker-bypass] [--rcp-bypass]

RUNS are kit output directories (with `mlperf.log`), raw result logs, or directories of
result logs (`result_*.txt`). The package (the layout the official package checker walks):

    DIR/<org>/results/<system>/{strong|weak}/<benchmark>/result_<i>.txt   (i from 0, by run_start)
    DIR/<org>/systems/<system>.json
    DIR/<org>/benchmarks/<benchmark>/implementations/hpckit-<version>/README.md
    DIR/<org>/benchmarks/<benchmark>/implementations/hpckit-<version>/README_<system>_<scaling>.md
    DIR/<org>/benchmarks/<benchmark>/implementations/hpckit-<version>/provenance_<system>_<scaling>.json

The logs are copied byte for byte (never edited). The system description comes from the
site profile's `system.yaml` (every field the official system-description checker
requires, except `submitter`, `division` and `status`, which come from --org, --division
and --status) or from --system-json; `number_of_nodes` is set from the runs' logs. The
software fields (`framework`, `other_software_stack`, `operating_system`) are what the
runs recorded when the kit made them (their provenance: summary.json beside a kit run's
mlperf.log, else the log's hpckit_provenance line; hpckit.common.provenance), not what the
profile claims; runs made with different software stacks are refused, as runs of
different node counts are. The implementation's README.md is the same for every system
(what the kit is, where its source is); what one results folder's runs recorded is in the
two files named after it, as published packages keep per-system config_<system>.sh files
there: README_<system>_<scaling>.md (the kit commit, software stack and training configs
the runs logged, how to reproduce one) and provenance_<system>_<scaling>.json (each
result's provenance, the package list too where summary.json was beside the log). So a
second system, or the other scaling of the same system, packaged into the same --out adds
its own files beside the first package's and rewrites none. Every file is written atomically. `--check` then runs the official package checker and result
summarizer on the package (see hpckit.results.checkers; `mini` = the kit's mini ruleset).
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

from hpckit.common.errors import KitError

# The official system-description checker's required fields (mlperf_logging
# system_desc_checker.check_system_desc; a test compares this list with its source).
REQUIRED_FIELDS = (
    "submitter", "division", "status", "system_name", "number_of_nodes",
    "host_processors_per_node", "host_processor_model_name", "host_processor_core_count",
    "host_processor_vcpu_count", "host_processor_frequency", "host_processor_caches",
    "host_processor_interconnect", "host_memory_capacity", "host_storage_type",
    "host_storage_capacity", "host_networking", "host_networking_topology",
    "host_memory_configuration", "accelerators_per_node", "accelerator_model_name",
    "accelerator_host_interconnect", "accelerator_frequency", "accelerator_on-chip_memories",
    "accelerator_memory_configuration", "accelerator_memory_capacity",
    "accelerator_interconnect", "accelerator_interconnect_topology", "cooling", "hw_notes",
    "framework", "other_software_stack", "operating_system", "sw_notes",
)
FILLED_BY_PACKAGER = ("submitter", "division", "status")
SITE_FIELDS = tuple(f for f in REQUIRED_FIELDS if f not in FILLED_BY_PACKAGER)
DIVISIONS = ("closed", "open")
STATUSES = ("onprem", "cloud", "preview", "research", "available")
BENCHMARKS = ("cosmoflow", "deepcam", "oc20", "openfold")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")
REPO = Path(__file__).resolve().parents[3]


def add_arguments(p) -> None:
    p.add_argument("runs", nargs="+", metavar="RUN",
                   help="kit output directories (mlperf.log), result logs, or directories of result_*.txt")
    p.add_argument("--site", default=None,
                   help="site profile: a name under site_profiles/ or a directory with system.yaml")
    p.add_argument("--org", required=True, help="submitting organisation (folder name and submitter)")
    from hpckit.common.fileio import output_dir
    p.add_argument("--out", required=True, type=output_dir("--out", "root"),
                   help="package root (created if new, its parent must exist); <org>/ is created under it, or "
                        "new files are added to an existing <org>/ (never one replaced); the package appears "
                        "whole or not at all")
    p.add_argument("--system", default=None,
                   help="system name (folder and systems/<system>.json; default: system_name of the profile)")
    p.add_argument("--division", choices=DIVISIONS, default=None,
                   help="default: the runs' submission_division")
    p.add_argument("--status", choices=STATUSES, default=None,
                   help="default: the runs' submission_status")
    p.add_argument("--benchmark", choices=BENCHMARKS, default=None,
                   help="every run must be this benchmark (and logs without submission_benchmark are taken as it)")
    p.add_argument("--system-json", default=None, metavar="FILE",
                   help="a complete system description JSON instead of the profile's system.yaml")
    p.add_argument("--check", default=None, metavar="RULESET",
                   help="afterwards run the official package checker and result summarizer "
                        "(hpc-1.0.0, hpc-2.0.0, hpc-3.0.0 or mini)")
    p.add_argument("--seed-checker-bypass", action="store_true",
                   help="with --check: pass --seed-checker-bypass (logs that log no seed, e.g. v1.0)")
    p.add_argument("--rcp-bypass", action="store_true", help="with --check: pass --rcp-bypass")
    p.add_argument("--config", default=None,
                   help="with --check mini: the training config (mini | FILE) whose target and sizes the mini "
                        "ruleset takes (default: each benchmark's mini), as hpckit check --config")


# ---- site profile and system description ---------------------------------------------

def profiles_root() -> Path:
    return REPO / "site_profiles"


def known_sites() -> list[str]:
    root = profiles_root()
    return sorted(d.name for d in root.iterdir() if (d / "system.yaml").is_file()) if root.is_dir() else []


def resolve_site(site: str) -> Path:
    """A profile name under site_profiles/ or a path to a profile directory / system.yaml."""
    path = Path(site)
    candidates = []
    if path.name == "system.yaml":
        candidates.append(path)
    if path.is_dir():
        candidates.append(path / "system.yaml")
    if _NAME_RE.match(site):
        candidates.append(profiles_root() / site / "system.yaml")
    for c in candidates:
        if c.is_file() or (os.path.lexists(c) and not c.is_dir()):   # the reader names what is odd about it
            return c
    if path.is_dir() or (profiles_root() / site).is_dir():
        where = path if path.is_dir() else profiles_root() / site
        raise KitError(f"site profile {where}: no system.yaml (the system description)")
    raise KitError(f"site profile {site!r}: not found (known: {', '.join(known_sites()) or 'none'})")


def _stringify(value, key: str, source):
    if isinstance(value, bool) or value is None:
        raise KitError(f"{source}: field '{key}' must be a string or number, got {value!r}")
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, str):
        return value
    if key == "other_software_stack" and isinstance(value, dict):
        return {str(k): _stringify(v, f"{key}.{k}", source) for k, v in value.items()}
    raise KitError(f"{source}: field '{key}' must be a string, got {type(value).__name__}")


def load_system_yaml(path: Path) -> dict:
    from hpckit.common.inputs import read_yaml
    data = read_yaml(path, f"system description {path}")
    if not isinstance(data, dict):
        raise KitError(f"system description {path}: expected a mapping of fields")
    missing = [f for f in SITE_FIELDS if f not in data]
    if missing:
        raise KitError(f"system description {path}: missing field '{missing[0]}'"
                       + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    extra = sorted(set(data) - set(SITE_FIELDS))
    if extra:
        filled = [k for k in extra if k in FILLED_BY_PACKAGER]
        hint = " (filled from --org/--division/--status)" if filled else ""
        raise KitError(f"system description {path}: unexpected field '{extra[0]}'{hint}")
    return {k: _stringify(data[k], k, f"system description {path}") for k in SITE_FIELDS}


def load_system_json(path: Path) -> dict:
    from hpckit.common.fileio import read_json
    data = read_json(path, f"--system-json {path}")
    if not isinstance(data, dict):
        raise KitError(f"--system-json {path}: expected a JSON object")
    missing = [f for f in REQUIRED_FIELDS if f not in data and f not in FILLED_BY_PACKAGER]
    if missing:
        raise KitError(f"--system-json {path}: missing field '{missing[0]}'")
    return {k: (v if k == "other_software_stack" and isinstance(v, dict)
                else _stringify(v, k, f"--system-json {path}")) for k, v in data.items()}


# ---- writing the package: whole or not at all --------------------------------------------

CHECKER_HEADER = "# hpckit package --check: the official package checker's output for"


def _json_bytes(obj) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode()


def _new_files(org_dir: Path, files: dict[str, bytes], system: str, groups) -> dict[str, bytes]:
    """The files of `files` (paths under <org>/) that are not there yet. One that is there
    is never rewritten: the same system description (an earlier package of this system) or
    the same bytes are left as they are; anything else is one line, before anything is
    written."""
    from hpckit.common.inputs import read_bytes
    system_json = f"systems/{system}.json"
    for (scaling, bench) in groups:
        bdir = org_dir / "results" / system / scaling / bench
        if bdir.is_symlink() or (bdir.exists() and (not bdir.is_dir() or any(bdir.iterdir()))):
            raise KitError(f"{bdir}: already holds results; use another --out or remove it")
    new = {}
    for rel, data in files.items():
        target = org_dir / rel
        if not os.path.lexists(target):
            new[rel] = data
            continue
        if target.is_symlink() or not target.is_file():
            raise KitError(f"{target}: exists and is not a file this package can leave as it is; use another --out")
        old = read_bytes(target, str(target))
        if rel == system_json:
            try:
                same = json.loads(old) == json.loads(data)
            except ValueError:
                same = False
            if not same:
                raise KitError(f"{target}: already exists with a different description; use another --out or --system")
        elif old != data:
            raise KitError(f"{target}: already exists with other content (changed since an earlier package "
                           "wrote it?); hpckit package never rewrites a file: use another --out")
    return new


# ---- runs --------------------------------------------------------------------------------

def collect_runs(args_runs: list[str]) -> list[tuple[Path, object]]:
    """The result logs under the arguments, found as `hpckit score` and `report` find them
    (hpckit.results.score.find_sets: a kit run's mlperf.log, result_*.txt, the submission
    layout), each read by the one log reader (hpckit.results.logs.parse_log). An argument
    given twice is an error here: a package must not hold a run twice."""
    from hpckit.results.logs import parse_log
    from hpckit.results.score import find_sets
    seen = set()
    for arg in map(Path, args_runs):
        if not arg.exists():
            from hpckit.common.inputs import absent
            raise KitError(f"run {arg}: {absent(arg)}")
        if arg.resolve() in seen:
            raise KitError(f"run {arg}: given twice")
        seen.add(arg.resolve())
    sets, _ = find_sets(args_runs, scaling="strong")
    return [(p, parse_log(p)) for s in sets for p in s["logs"]]


def _one(values: set, what: str, given):
    values.discard(None)
    if given is not None:
        return given
    if len(values) > 1:
        raise KitError(f"the runs disagree on {what} ({', '.join(sorted(map(str, values)))}); "
                       f"give --{what.replace('submission_', '')}")
    return values.pop() if values else None


def kit_version() -> str:
    try:
        from importlib.metadata import version
        return version("mlperf-hpc-kit")
    except Exception:
        import hpckit
        return hpckit.__version__


def _git_commit() -> str | None:
    """The kit checkout's commit, read as provenance reads it (never hangs on an odd .git)."""
    if not os.path.lexists(REPO / ".git"):
        return None
    from hpckit.common.provenance import head_commit
    return head_commit(REPO)[0]


def _hpckit_config(log: Path) -> str | None:
    from hpckit.results.logs import records
    for rec in records(log):
        if rec["key"] == "hpckit_config":
            name = rec.get("value").get("name") if isinstance(rec.get("value"), dict) else None
            return name if isinstance(name, str) else None
    return None


# ---- provenance: the stack the runs recorded ------------------------------------------

FRAMEWORK_NAMES = {"pytorch": ("PyTorch", ("torch",)),
                   "tensorflow": ("TensorFlow", ("tensorflow", "tensorflow-cpu"))}


def run_provenance(runs: list) -> dict[Path, dict | None]:
    from hpckit.common.provenance import of_run
    return {path: of_run(path) for path, _ in runs}


def check_one_stack(provs: dict) -> None:
    """A package describes one system and one software stack: runs that recorded
    different stacks are refused, naming the first difference."""
    from hpckit.common.provenance import differences, stack, stack_digest
    seen: dict[str, tuple[Path, dict]] = {}
    for path, prov in provs.items():
        s = stack(prov)
        if s is not None:
            seen.setdefault(stack_digest(s), (path, s))
    if len(seen) > 1:
        (pa, a), (pb, b) = list(seen.values())[:2]
        diff = "; ".join(differences(a, b)[:6]) or "their recorded stacks differ"
        raise KitError(f"the runs were made with {len(seen)} different software stacks ({pa} against {pb}: "
                       f"{diff}); package each stack as its own --system")


def software_fields(provs: dict, desc: dict, packaged_as: str) -> dict:
    """framework, other_software_stack and operating_system from what the runs recorded;
    the profile's values where no run recorded a provenance."""
    recorded = [p for p in provs.values() if p]
    if not recorded:
        return {}
    first = recorded[0]
    fw = first.get("frameworks") or {}
    names = []
    for prov in recorded:
        name, dists = FRAMEWORK_NAMES.get(prov.get("framework") or "", (prov.get("framework"), ()))
        version = next((prov["frameworks"][d] for d in dists if (prov.get("frameworks") or {}).get(d)), None)
        if name:
            names.append(f"{name} {version}" if version else name)
    other = dict(desc.get("other_software_stack")) if isinstance(desc.get("other_software_stack"), dict) else (
        {"site": desc["other_software_stack"]} if desc.get("other_software_stack") else {})
    kit = first.get("kit") or {}
    commit = kit.get("commit")
    other["hpckit"] = f"{kit.get('version')}" + (f" (git {commit}{', uncommitted changes' if kit.get('dirty') else ''})"
                                                 if commit else "")
    other["python"] = str((first.get("python") or {}).get("version"))
    for dist in ("mlperf-logging", "numpy", "keras", "h5py", "horovod"):
        if fw.get(dist):
            other[dist.replace("-", "_")] = str(fw[dist])   # the profiles' spelling (mlperf_logging)
    for key in ("torch_cuda", "torch_cudnn", "tensorflow_cuda", "tensorflow_cudnn"):
        if fw.get(key):
            other[key.replace("_", " ")] = str(fw[key])
    pk = first.get("packages") or {}
    other["python packages"] = f"{pk.get('count')} installed, sha256 {pk.get('sha256')} ({packaged_as})"
    if first.get("spack"):
        sp = first["spack"]
        other["spack environment"] = (f"{sp.get('env')}, spack.lock sha256 {sp.get('lock_sha256')}"
                                      + (f", spack {sp['spack']}" if sp.get("spack") else ""))
    if first.get("container"):
        c = first["container"]
        other["container"] = " ".join(str(x) for x in (c.get("runtime"), c.get("image"), c.get("digest")) if x)
    if first.get("gpu"):
        other["gpu driver"] = str(first["gpu"].get("driver"))
    host = first.get("host") or {}
    return {"framework": ", ".join(sorted(set(names))) or desc.get("framework"),
            "other_software_stack": other,
            "operating_system": f"{host.get('os')} (kernel {host.get('kernel')}, {host.get('machine')})"}


def benchmark_readme(benchmark: str, version: str) -> str:
    """The implementation's README.md: the same for every system and scaling packaged with
    this kit version (a second system's package leaves the first's as it is)."""
    return "\n".join([
        f"# {benchmark}: hpckit {version}", "",
        f"Implementation: the MLPerf HPC reproducibility kit (`hpckit`, distribution `mlperf-hpc-kit` {version}); "
        f"its source: `apps/hpckit/{benchmark}/` and `apps/hpckit/common/` of the kit's repository.", "",
        f"What each results folder's runs recorded (results/<system>/<scaling>/{benchmark}/):", "",
        "- `README_<system>_<scaling>.md`: the kit commit, software stack and training config the runs "
        "logged, and how to reproduce one;",
        "- `provenance_<system>_<scaling>.json`: every result file's full provenance record.", ""])


def results_readme(benchmark: str, system: str, scaling: str, runs: list, version: str,
                   provs: dict | None = None) -> str:
    """README_<system>_<scaling>.md: what the runs of one results folder recorded."""
    from hpckit.common.provenance import summary_line
    recorded = {(p.get("kit") or {}).get("commit") for p in (provs or {}).values() if p}
    recorded.discard(None)
    commit = ", ".join(sorted(recorded)) if recorded else _git_commit()
    configs = sorted({c for c in (_hpckit_config(p) for p, _ in runs) if c})
    lines = [f"# {benchmark} on {system} ({scaling} scaling): hpckit {version}", "",
             f"{len(runs)} result file(s) in `results/{system}/{scaling}/{benchmark}/`.",
             f"Source: the kit's repository{f' at commit {commit}' if commit else ''}"
             + (" (the commit the runs recorded)." if recorded else "."), ""]
    stacks = sorted({summary_line(p) for p in (provs or {}).values() if p})
    if stacks:
        lines += ["Software stack recorded by the runs (`hpckit_provenance`; every result's full record, "
                  f"with the installed packages, in `provenance_{system}_{scaling}.json`):", "",
                  *(f"- {s}" for s in stacks), ""]
    if configs:
        lines += [f"Training config(s) logged by the runs (`hpckit_config`): {', '.join(configs)}.", "",
                  "Reproduce one run:", "", "```sh",
                  f"hpckit train {benchmark} --data DATA --config {configs[0]} --output-dir OUT --seed SEED",
                  "```", ""]
    else:
        lines += ["The runs were not written by hpckit (no `hpckit_config` line); they are "
                  "packaged as given.", ""]
    return "\n".join(lines)


def main(args) -> int:
    from hpckit.common.fileio import atomic_write_text, check_output, place_tree
    from hpckit.common.inputs import read_bytes

    if args.system_json is None and args.site is None:
        raise KitError(f"give --site (known: {', '.join(known_sites()) or 'none'}) or --system-json")
    if not _NAME_RE.match(args.org):
        raise KitError(f"--org {args.org!r}: use letters, digits, '.', '_', '+', '-'")
    if args.check is not None:   # before anything is written
        from hpckit.results.checkers import CHECK_RULESETS
        if args.check not in CHECK_RULESETS:
            raise KitError(f"--check {args.check!r}: expected one of {', '.join(CHECK_RULESETS)}")
    if getattr(args, "config", None) is not None and args.check != "mini":
        raise KitError(f"--config {args.config}: applies to --check mini only")
    if args.system_json is not None:
        desc = load_system_json(Path(args.system_json))
        source = f"--system-json {args.system_json}"
    else:
        yaml_path = resolve_site(args.site)
        desc = load_system_yaml(yaml_path)
        source = f"system description {yaml_path}"
    system = args.system or desc.get("system_name")
    if not system or not _NAME_RE.match(system):
        raise KitError(f"system name {system!r} (from {'--system' if args.system else source}): "
                       "use letters, digits, '.', '_', '+', '-'")
    desc["system_name"] = system

    runs = collect_runs(args.runs)
    for path, r in runs:
        bench = (r.benchmark or args.benchmark or "").lower()
        if not bench:
            raise KitError(f"log {path}: no submission_benchmark; give --benchmark")
        if args.benchmark and bench != args.benchmark:
            raise KitError(f"log {path}: benchmark {bench}, not --benchmark {args.benchmark}")
        if bench not in BENCHMARKS:
            raise KitError(f"log {path}: unknown benchmark {bench!r} (known: {', '.join(BENCHMARKS)})")
    division = _one({r.division for _, r in runs}, "division", args.division) or "closed"
    status = _one({r.status for _, r in runs}, "status", args.status) or "onprem"
    for path, r in runs:
        if r.division and r.division != division:
            raise KitError(f"log {path}: submission_division {r.division}, package division {division}")
    nodes = {r.number_of_nodes for _, r in runs if r.number_of_nodes is not None}
    if len(nodes) > 1:
        raise KitError(f"the runs use different node counts ({', '.join(map(str, sorted(nodes)))}); "
                       "package each scale as its own --system")
    if nodes:
        desc["number_of_nodes"] = str(nodes.pop())
    accels = {r.accelerators_per_node for _, r in runs if r.accelerators_per_node is not None}
    if accels and {str(a) for a in accels} != {str(desc["accelerators_per_node"])}:
        raise KitError(f"{source}: accelerators_per_node {desc['accelerators_per_node']} but the runs log "
                       f"{', '.join(map(str, sorted(accels)))}")
    desc.update(submitter=args.org, division=division, status=status)
    provs = run_provenance(runs)
    check_one_stack(provs)
    version = kit_version()
    recorded = software_fields(provs, desc, f"list in benchmarks/<benchmark>/implementations/hpckit-{version}/"
                                            f"provenance_{system}_<scaling>.json")
    if recorded:
        desc.update(recorded)
        note = "Software fields as recorded by the runs (hpckit_provenance)."
        if note not in desc.get("sw_notes", ""):
            desc["sw_notes"] = f"{desc.get('sw_notes', '')} {note}".strip()
    desc = {k: desc[k] for k in REQUIRED_FIELDS} | {k: v for k, v in desc.items() if k not in REQUIRED_FIELDS}

    warnings = []
    other_org = [(p, r.org) for p, r in runs if r.org and r.org != args.org]
    if other_org:
        warnings.append(f"{len(other_org)} run(s) log submission_org {other_org[0][1]!r}, not --org "
                        f"{args.org!r} (e.g. {other_org[0][0]}; hpckit train --set mlperf.org=...)")

    # Group: (scaling, benchmark) -> runs ordered by run_start.
    groups: dict[tuple[str, str], list] = {}
    for path, r in runs:
        scaling = "weak" if r.instance is not None else "strong"
        groups.setdefault((scaling, (r.benchmark or args.benchmark).lower()), []).append((path, r))
    from mlperf_logging.benchmark_meta import get_result_file_counts
    counts = get_result_file_counts("hpc")
    for (scaling, bench), members in groups.items():
        members.sort(key=lambda pr: (pr[1].run_start_ms, str(pr[0])))
        need = counts.get(bench)
        if need and (len(members) != need if scaling == "strong" else len(members) < need):
            warnings.append(f"{bench} ({scaling} scaling): {len(members)} runs; the rules ask for "
                            f"{'exactly' if scaling == 'strong' else 'at least'} {need}")
        if scaling == "strong" and division == "closed":
            from hpckit.results.logs import records
            seedless = [str(p) for p, _ in members if not any(r["key"] == "seed" for r in records(p))]
            if seedless:
                warnings.append(f"{bench}: {len(seedless)} run(s) log no seed (e.g. {seedless[0]}); the "
                                "package checker's seed check fails on them (--seed-checker-bypass)")

    configs = None
    if getattr(args, "config", None) is not None:   # before anything is written
        from hpckit.common.compliance import MINI_RULES
        from hpckit.common.config import load_config
        configs = {bench: load_config(bench, args.config) for _, bench in groups if bench in MINI_RULES}

    out_root = Path(args.out)
    org_dir = out_root / args.org
    checker_txt = out_root / f"{args.org}.package_checker.txt"
    files: dict[str, bytes] = {f"systems/{system}.json": _json_bytes(desc)}
    for (scaling, bench), members in sorted(groups.items()):
        results = f"results/{system}/{scaling}/{bench}"
        for i, (path, _) in enumerate(members):
            files[f"{results}/result_{i}.txt"] = read_bytes(path, f"log {path}")
        impl = f"benchmarks/{bench}/implementations/hpckit-{version}"
        files[f"{impl}/README.md"] = benchmark_readme(bench, version).encode()
        files[f"{impl}/README_{system}_{scaling}.md"] = results_readme(bench, system, scaling, members, version,
                                                                      provs).encode()
        files[f"{impl}/provenance_{system}_{scaling}.json"] = _json_bytes(
            {f"{results}/result_{i}.txt": {"source": str(path), "provenance": provs.get(path)}
             for i, (path, _) in enumerate(members)})
    new = _new_files(org_dir, files, system, groups)
    if args.check and out_root.is_dir():    # before anything is written
        check_output(checker_txt, "--out", CHECKER_HEADER.encode())
    place_tree(out_root, args.org, new, "--out")
    for (scaling, bench), members in sorted(groups.items()):
        print(f"{bench}: {len(members)} runs -> {org_dir / 'results' / system / scaling / bench}")
    system_json = org_dir / "systems" / f"{system}.json"

    if warnings:   # one line, whatever their number (a user reads stderr line by line)
        print(f"hpckit package: warning: {'; '.join(warnings)}", file=sys.stderr)
    print(f"system description -> {system_json}")
    if not args.check:
        return 0
    from hpckit.results.checkers import run_package_checker, run_result_summarizer
    pc = run_package_checker(org_dir, args.check, seed_checker_bypass=args.seed_checker_bypass,
                             rcp_bypass=args.rcp_bypass, configs=configs)
    rs = run_result_summarizer(org_dir, args.check, configs)
    atomic_write_text(checker_txt, f"{CHECKER_HEADER} {org_dir}\n{pc.output}", "--out", CHECKER_HEADER.encode())
    print(pc.verdict)
    print(rs.verdict)
    sys.stdout.flush()
    return 0 if pc.ok and rs.ok else 1
