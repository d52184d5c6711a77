"""Every decision that reads the CPU, driven by the recorded /proc/cpuinfo of real nodes
(tests/data/cpuinfo/*.txt, one processor block each, provenance in each file's header):
a Knights Landing Xeon Phi, a Fujitsu A64FX, an AVX2-only EPYC and two AVX-512+bf16 EPYCs
(a 9654 and the development VM). The decisions read the CPU through cores.cpuinfo(), which
HPCKIT_CPUINFO points at a file: nothing here replaces a decision by a stand-in."""

from __future__ import annotations

import pytest

from conftest import REPO, run_hpckit
from hpckit.common import cores, memory, precision
from hpckit.common.errors import KitError

CPUINFO = REPO / "tests" / "data" / "cpuinfo"

# recorded file -> (arch, model, class, bf16, oneDNN ISA, --framework auto on a CPU)
EXPECTED = {
    "knl-xeon-phi.txt": ("x86_64", "Intel(R) Xeon Phi(TM) CPU 7210 @ 1.30GHz", "x86-knl", False, "avx2",
                         "pytorch"),
    "a64fx.txt": ("aarch64", "Fujitsu A64FX", "aarch64-sve", False, "sve", "pytorch"),
    "epyc-avx2.txt": ("x86_64", "AMD EPYC 7301 16-Core Processor", "x86-avx2", False, "avx2", "pytorch"),
    "epyc-avx512-bf16-9654.txt": ("x86_64", "AMD EPYC 9654 96-Core Processor", "x86-avx512-bf16", True,
                                  "avx512_core_bf16", "tensorflow"),
    "epyc-avx512-bf16-devvm.txt": ("x86_64", "AMD EPYC", "x86-avx512-bf16", True, "avx512_core_bf16",
                                   "tensorflow"),
}


def test_every_recorded_file_is_covered():
    assert sorted(p.name for p in CPUINFO.glob("*.txt")) == sorted(EXPECTED)
    for p in CPUINFO.glob("*.txt"):
        head = p.read_text().splitlines()[:6]
        assert any("Source:" in line or "recorded" in line for line in head), f"{p.name}: no provenance"


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_what_each_cpu_is(name):
    arch, model, kind, bf16, isa, _ = EXPECTED[name]
    info = cores.cpuinfo(CPUINFO / name)
    assert (info.arch, info.model, cores.cpu_class(info), cores.has_bf16(info), cores.onednn_isa(info)) == \
        (arch, model, kind, bf16, isa), info


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_decisions_follow_the_recorded_cpu(monkeypatch, name):
    """--framework auto, bf16 acceptance and the flags the kit logs, each through
    HPCKIT_CPUINFO as a real run on that node would read /proc/cpuinfo."""
    from hpckit.cosmoflow.train import choose_framework
    arch, _, kind, bf16, _, framework = EXPECTED[name]
    monkeypatch.setenv(cores.CPUINFO_ENV, str(CPUINFO / name))
    assert choose_framework("auto", "cpu") == framework
    assert cores.cpu_class() == kind
    if bf16:
        precision.check("bf16", "cpu")
    else:
        with pytest.raises(KitError, match="no bf16 instructions"):
            precision.check("bf16", "cpu")
    flags = cores.cpu_flags()
    assert ("sve" in flags) == (name == "a64fx.txt") and ("asimd" in flags) == (arch == "aarch64")


def test_knl_is_not_taken_for_an_avx512_server():
    """The rule that was there before (`avx512f` in the flags -> TensorFlow, AVX-512) would
    have taken KNL for a modern AVX-512 server: the recorded KNL has avx512f, and still
    lacks what oneDNN's avx512_core needs."""
    info = cores.cpuinfo(CPUINFO / "knl-xeon-phi.txt")
    assert {"avx512f", "avx512cd", "avx512er", "avx512pf"} <= info.flags
    assert not info.flags & {"avx512bw", "avx512dq", "avx512vl", "avx512_bf16"}
    assert cores.cpu_class(info) == "x86-knl" and cores.onednn_isa(info) == "avx2"


def test_aarch64_reads_features_not_flags():
    """A64FX's /proc/cpuinfo has `Features`, no `flags`, no `model name`: the kit must not
    come back empty-handed (an empty flag set would read as 'no SVE, no asimd')."""
    text = (CPUINFO / "a64fx.txt").read_text()
    assert "\nflags" not in text and "model name" not in text
    info = cores.parse_cpuinfo(text)
    assert {"sve", "asimd", "fphp", "asimdhp"} <= info.flags and "bf16" not in info.flags


def test_machine_keys_tell_the_recorded_cpus_apart(monkeypatch):
    keys = {}
    for name in EXPECTED:
        monkeypatch.setenv(cores.CPUINFO_ENV, str(CPUINFO / name))
        keys[name] = cores.machine_key()
        assert cores.machine_key() == keys[name]
    assert len(set(keys.values())) == len(keys), keys


def test_an_unreadable_or_foreign_file_is_unknown(tmp_path, monkeypatch):
    monkeypatch.setenv(cores.CPUINFO_ENV, str(tmp_path / "missing"))
    info = cores.cpuinfo()
    assert info.arch == "unknown" and cores.cpu_class(info) == "unknown" and not cores.has_bf16(info)
    from hpckit.cosmoflow.train import choose_framework
    assert choose_framework("auto", "cpu") == "pytorch"


def test_tcmalloc_is_looked_for_in_the_multiarch_folder():
    """Debian puts libtcmalloc-minimal4 in /usr/lib/<multiarch>/: aarch64-linux-gnu on Arm
    (test_arm64.py finds it there in an arm64 root file system under emulation)."""
    dirs = [str(d) for d in memory.system_lib_dirs("aarch64")]
    assert dirs[0] == "/usr/lib/aarch64-linux-gnu"
    import platform
    import sysconfig
    native = sysconfig.get_config_var("MULTIARCH") or f"{platform.machine()}-linux-gnu"
    assert str(memory.system_lib_dirs()[0]) == f"/usr/lib/{native}"


@pytest.mark.parametrize("name,framework", [("knl-xeon-phi.txt", "pytorch"), ("epyc-avx512-bf16-9654.txt", "tensorflow")])
def test_a_command_reads_the_cpu_it_is_pointed_at(name, framework):
    """End to end: `hpckit describe` in a process whose HPCKIT_CPUINFO is a recorded node."""
    proc = run_hpckit("describe", "cosmoflow", "--config", "mini", env={cores.CPUINFO_ENV: str(CPUINFO / name)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.splitlines()[0] == f"CosmoFlow, config mini, {framework}", proc.stdout


def test_bf16_on_knl_is_one_line(tmp_path):
    proc = run_hpckit("train", "cosmoflow", "--data", tmp_path, "--config", "mini", "--output-dir", tmp_path / "o",
                      "--set", "train.precision=bf16", env={cores.CPUINFO_ENV: str(CPUINFO / "knl-xeon-phi.txt")})
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert proc.stderr.strip().count("\n") == 0 and "no bf16 instructions" in proc.stderr, proc.stderr
