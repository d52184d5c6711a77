"""`hpckit references calibrate`: references from repeated runs' perflogs, in the format
the site profiles' filelog handler writes (site_profiles/site_common.PERFLOG_FORMAT; the
end-to-end case with real ReFrame runs is in test_reframe_checks.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from conftest import run_hpckit

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "site_profiles"))
from site_common import PERFLOG_FORMAT  # noqa: E402

HEADER = "|".join(f.split("(check_")[1].split(")")[0] for f in PERFLOG_FORMAT.split("|"))


def this_stack() -> dict:
    """The software stack of this test process, as a run records it (common/provenance.py)."""
    from hpckit.common import provenance
    return provenance.stack(provenance.collect())


STACK = json.dumps(this_stack(), separators=(",", ":"))


def line(when, var, value, unit, check="CosmoFlowCheck %framework=pytorch", result="pass", stack=STACK):
    return f"{when}|{result}|{check}|hpckit-venv|mini|0|{var}|{value}|{unit}|0|null|null|{result}|vm|{stack}"


def perflog(folder: Path, runs: list[dict], check="CosmoFlowCheck %framework=pytorch", stacks=None) -> Path:
    path = folder / "local" / "default" / f"{check.split()[0]}.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [HEADER]
    for i, figures in enumerate(runs):
        for var, (value, unit) in figures.items():
            lines.append(line(f"2026-11-22T10:0{i}:00", var, value, unit, check,
                              stack=stacks[i] if stacks else STACK))
    lines.append(line("2026-11-22T11:00:00", "time_to_train", "null", "min", check, result="fail"))  # sanity failed
    path.write_text("\n".join(lines) + "\n")
    return folder


def runs(ttt, thr, epochs=(5, 5, 5)):
    return [{"time_to_train": (t, "min"), "train_throughput": (x, "samples/s"), "epochs": (e, "epochs")}
            for t, x, e in zip(ttt, thr, epochs)]


def test_median_and_tolerance_from_the_spread(tmp_path):
    logs = perflog(tmp_path / "perflogs", runs([1.0, 1.1, 0.9], [100, 104, 98]))
    out = tmp_path / "refs" / "references.yaml"
    proc = run_hpckit("references", "calibrate", "--perflog", logs, "--out", out)
    assert proc.returncode == 2 and f"cannot write into {out.parent}: no such directory" in proc.stderr, proc.stderr
    out.parent.mkdir()
    proc = run_hpckit("references", "calibrate", "--perflog", logs, "--out", out)
    assert proc.returncode == 0, proc.stderr
    text = out.read_text()
    assert text.startswith("# Performance references calibrated by `hpckit references calibrate`")
    assert "machine key" in text and "flags" in text and "torch" in text
    # the runs' recorded stack, readable back from the header (what a FAILing check compares)
    from hpckit.common.provenance import parse_header
    assert parse_header(text) == json.loads(STACK)
    assert f"#   stack.packages_sha256: {json.loads(STACK)['packages_sha256']}\n" in text
    refs = yaml.safe_load(text)["CosmoFlowCheck"]
    assert refs["$index"] == ["$partition", "config", "framework"]
    entry = refs["local:default"]["mini"]["pytorch"]
    # time: median 1.0, largest deviation 10 % -> 2 x 10 % = 0.2 above; throughput: median
    # 100, deviation 4 % -> 8 %, under the 10 % floor -> 0.1 below; equal epochs -> floor
    assert entry["time_to_train"] == [1.0, None, 0.2, "min"]
    assert entry["train_throughput"] == [100, -0.1, None, "samples/s"]
    assert entry["epochs"] == [5, None, 0.1, "epochs"]


def test_ceiling_and_too_few_runs(tmp_path):
    logs = perflog(tmp_path / "p", runs([1.0, 3.0, 1.0], [100, 100, 100]))
    out = tmp_path / "r.yaml"
    assert run_hpckit("references", "calibrate", "--perflog", logs, "--out", out, "--ceiling", "0.4").returncode == 0
    assert yaml.safe_load(out.read_text())["CosmoFlowCheck"]["local:default"]["mini"]["pytorch"]["time_to_train"][2] == 0.4
    few = perflog(tmp_path / "few", runs([1.0, 1.0], [100, 100]))
    proc = run_hpckit("references", "calibrate", "--perflog", few, "--out", tmp_path / "x.yaml")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "2 figure(s), --min-runs 3 needed" in proc.stderr and not (tmp_path / "x.yaml").exists()


def test_a_bound_is_never_tighter_than_the_timer_resolution(tmp_path):
    """Staging of 0.20 .. 0.22 s: the spread gives a 10 % bound (0.022 s), the resolution
    1.0 s wins (4.762 as a fraction of the 0.21 s median); a 100 s staging keeps its
    relative bound. --resolution s=0 turns it off."""
    def staging(values):
        return [{"staging_time": (v, "s"), "time_to_train": (1.0, "min"), "train_throughput": (100, "samples/s"),
                 "epochs": (5, "epochs")} for v in values]
    out = tmp_path / "r.yaml"
    logs = perflog(tmp_path / "small", staging([0.20, 0.21, 0.22]))
    assert run_hpckit("references", "calibrate", "--perflog", logs, "--out", out).returncode == 0
    entry = yaml.safe_load(out.read_text())["CosmoFlowCheck"]["local:default"]["mini"]["pytorch"]
    assert entry["staging_time"] == [0.21, None, 4.762, "s"]
    assert entry["train_throughput"] == [100, -0.1, None, "samples/s"]   # no resolution for rates
    assert run_hpckit("references", "calibrate", "--perflog", logs, "--out", out, "--replace",
                      "--resolution", "s=0").returncode == 0
    assert yaml.safe_load(out.read_text())["CosmoFlowCheck"]["local:default"]["mini"]["pytorch"][
        "staging_time"] == [0.21, None, 0.1, "s"]
    big = perflog(tmp_path / "big", staging([100.0, 101.0, 99.0]))
    assert run_hpckit("references", "calibrate", "--perflog", big, "--out", out, "--replace").returncode == 0
    assert yaml.safe_load(out.read_text())["CosmoFlowCheck"]["local:default"]["mini"]["pytorch"][
        "staging_time"] == [100.0, None, 0.1, "s"]


def test_never_replaces_unasked(tmp_path):
    """An existing file is replaced only with --replace, and only a references file this
    command wrote: a site's own references.yaml is never replaced, --replace or not."""
    logs = perflog(tmp_path / "p", runs([1.0, 1.0, 1.0], [100, 100, 100]))
    out = tmp_path / "references.yaml"
    out.write_text("# the site's own\n")
    for extra in ((), ("--replace",)):
        proc = run_hpckit("references", "calibrate", "--perflog", logs, "--out", out, *extra)
        assert proc.returncode == 2 and "--replace" in proc.stderr and "Traceback" not in proc.stderr
        assert proc.stderr.count("\n") == 1, proc.stderr
        assert out.read_text() == "# the site's own\n"
    mine = tmp_path / "mine.yaml"
    assert run_hpckit("references", "calibrate", "--perflog", logs, "--out", mine).returncode == 0
    proc = run_hpckit("references", "calibrate", "--perflog", logs, "--out", mine)
    assert proc.returncode == 2 and "--replace" in proc.stderr, proc.stderr
    assert run_hpckit("references", "calibrate", "--perflog", logs, "--out", mine, "--replace").returncode == 0
    assert "CosmoFlowCheck" in mine.read_text()


@pytest.mark.parametrize("args,message", [
    (["--perflog", "/nonexistent/perflogs"], "no such file or directory"),
    (["--min-runs", "0"], "--min-runs 0"),
    (["--floor", "0.6", "--ceiling", "0.5"], "--floor 0.6"),
    (["--factor", "0"], "--factor 0"),
    (["--resolution", "s"], "--resolution 's'"),
    (["--resolution", "s=-1"], "--resolution 's=-1'"),
])
def test_bad_options_are_one_line(tmp_path, args, message):
    logs = perflog(tmp_path / "p", runs([1.0, 1.0, 1.0], [100, 100, 100]))
    base = ["references", "calibrate", "--perflog", logs, "--out", tmp_path / "o.yaml"]
    if args[0] == "--perflog":
        base[3] = args[1]
        args = []
    proc = run_hpckit(*base, *args)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and message in proc.stderr, proc.stderr


def test_garbled_perflog_names_the_file(tmp_path):
    bad = tmp_path / "perflogs" / "local" / "default" / "CosmoFlowCheck.log"
    bad.parent.mkdir(parents=True)
    bad.write_text(HEADER + "\n" + "2026-11-22T10:00:00|pass|CosmoFlowCheck|only|four\n")
    proc = run_hpckit("references", "calibrate", "--perflog", tmp_path / "perflogs", "--out", tmp_path / "o.yaml")
    assert proc.returncode == 2 and str(bad) in proc.stderr and "line 2" in proc.stderr, proc.stderr


def test_profile_uses_only_this_machines_references(tmp_path, capsys):
    """site_common.machine_reference_prefix: the calibrated folder of THIS machine's key
    when it holds references.yaml, else the profile folder (nothing judged) and one line
    saying how to calibrate."""
    from site_common import machine_reference_prefix
    from hpckit.common.cores import machine_key
    profile = tmp_path / "local"
    (profile / "calibrated" / "another-machine-0000").mkdir(parents=True)
    (profile / "calibrated" / "another-machine-0000" / "references.yaml").write_text("x: 1\n")
    assert machine_reference_prefix(str(profile)) == str(profile)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "make calibrate PROFILE=local" in err and machine_key() in err
    mine = profile / "calibrated" / machine_key()
    mine.mkdir()
    (mine / "references.yaml").write_text("x: 1\n")
    assert machine_reference_prefix(str(profile)) == str(mine)
    assert capsys.readouterr().err == ""


def test_runs_of_two_stacks_are_refused_and_old_perflogs_say_not_recorded(tmp_path):
    """References tie a machine's figures to one software stack: perflog lines of two
    stacks (here a package upgraded between runs) are refused in one line naming the
    package; perflogs from before the `stack` field give a header that says so."""
    other = json.loads(STACK)
    other["packages"] = [p if not p.startswith("numpy==") else "numpy==0.0.1" for p in other["packages"]]
    other["packages_sha256"] = "0" * 64
    logs = perflog(tmp_path / "mixed", runs([1.0, 1.1, 0.9], [100, 104, 98]),
                   stacks=[STACK, STACK, json.dumps(other)])
    out = tmp_path / "r.yaml"
    proc = run_hpckit("references", "calibrate", "--perflog", logs, "--out", out)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    numpy = next(p for p in json.loads(STACK)["packages"] if p.startswith("numpy=="))
    assert "2 different software stacks" in proc.stderr and f"numpy {numpy[7:]} -> 0.0.1" in proc.stderr, proc.stderr
    assert not out.exists()
    old = perflog(tmp_path / "old", runs([1.0, 1.1, 0.9], [100, 104, 98]), stacks=["null"] * 3)
    assert run_hpckit("references", "calibrate", "--perflog", old, "--out", out).returncode == 0
    text = out.read_text()
    assert "# Software stack: not recorded" in text and "stack.packages" not in text
    from hpckit.common.provenance import parse_header
    assert parse_header(text) is None
