"""The energy a run records (common/energy.py): RAPL's package counters read from a powercap
tree (here one laid out as the kernel's, in a temporary directory: this machine's may be absent
or root-only), their wrap at max_energy_range_uj counted, subzones left out; a counter that
cannot be read is absent with the reason, never 0 J; NVML absent off CUDA, with the reason."""

from __future__ import annotations

import pytest

from hpckit.common import energy


def powercap(root, packages: dict[int, tuple[int, int]]):
    for n, (uj, top) in packages.items():
        d = root / f"intel-rapl:{n}"
        d.mkdir(parents=True)
        (d / "energy_uj").write_text(f"{uj}\n")
        (d / "max_energy_range_uj").write_text(f"{top}\n")
        sub = root / f"intel-rapl:{n}:0"   # a core or DRAM subzone: inside the package's figure
        sub.mkdir()
        (sub / "energy_uj").write_text("123\n")
    return root


def test_rapl_packages_summed_and_wraps_counted(tmp_path):
    root = powercap(tmp_path, {0: (1_000_000, 10_000_000), 1: (9_000_000, 10_000_000)})
    assert [d.name for d in energy.rapl_domains(str(root))] == ["intel-rapl:0", "intel-rapl:1"]
    meter = energy.CpuEnergy(True, str(root))
    assert meter.why is None and meter.read() == 0.0
    (root / "intel-rapl:0" / "energy_uj").write_text("3500000\n")    # +2.5 J
    (root / "intel-rapl:1" / "energy_uj").write_text("500000\n")     # wrapped: +1.5 J
    assert meter.read() == pytest.approx(4.0)
    (root / "intel-rapl:0" / "energy_uj").write_text("4500000\n")    # +1 J
    assert meter.read() == pytest.approx(5.0)


def test_rapl_absent_or_unreadable_is_said_not_zero(tmp_path):
    meter = energy.CpuEnergy(True, str(tmp_path / "none"))
    assert meter.read() is None and "no RAPL domain" in meter.why
    root = powercap(tmp_path / "pc", {0: (5, 100)})
    (root / "intel-rapl:0" / "energy_uj").unlink()
    (root / "intel-rapl:0" / "energy_uj").mkdir()                    # reading it fails
    meter = energy.CpuEnergy(True, str(root))
    assert meter.read() is None and "energy_uj" in meter.why
    assert energy.CpuEnergy(False, str(root)).read() is None          # not this node's reader


def test_gpu_energy_off_cuda_is_absent_with_the_reason():
    import torch
    meter = energy.GpuEnergy(torch.device("cpu"))
    assert meter.read() is None and meter.why == "not a CUDA run"
