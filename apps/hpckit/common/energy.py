"""The energy a run used, where the machine lets a process read it: recorded, never judged.

- GPU: NVML's total energy counter of the rank's GPU (nvmlDeviceGetTotalEnergyConsumption,
  millijoules since the driver loaded; Volta and newer), through nvidia-ml-py (`pynvml`,
  which NVIDIA's images ship).
- CPU: the RAPL package domains of /sys/class/powercap (intel-rapl:N energy_uj, microjoules,
  wrapping at max_energy_range_uj; AMD's are exposed there too). Read by one rank per node
  (local rank 0): the packages are the node's. Since 2020 many kernels let only root read
  energy_uj.

Where a counter cannot be read the figure is None and `why` says so: absent is said as
absent, never as 0 J. Read at each epoch's start and end (MLPerfRun), so the figure covers
the training and evaluation epochs, summed over ranks (GPUs) and nodes (packages).
"""

from __future__ import annotations

import glob
import os
from pathlib import Path

POWERCAP = "/sys/class/powercap"


class GpuEnergy:
    def __init__(self, device):
        self.handle, self.why = None, None
        if getattr(device, "type", None) != "cuda":
            self.why = "not a CUDA run"
            return
        try:
            import pynvml
        except ImportError:
            self.why = "nvidia-ml-py (pynvml) not installed"
            return
        try:
            pynvml.nvmlInit()
            index = device.index if device.index is not None else 0
            try:   # CUDA's device order and CUDA_VISIBLE_DEVICES mapped to NVML's
                import torch
                index = torch.cuda._get_nvml_device_index(index)
            except Exception:
                pass
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            self._read = lambda: pynvml.nvmlDeviceGetTotalEnergyConsumption(self.handle) / 1e3
            self._read()
        except Exception as e:   # pynvml.NVMLError and its kin: no driver, not supported
            self.handle, self.why = None, f"NVML: {str(e) or type(e).__name__}"

    def read(self) -> float | None:
        """Joules since the driver loaded, or None."""
        if self.handle is None:
            return None
        try:
            return float(self._read())
        except Exception as e:
            self.handle, self.why = None, f"NVML: {str(e) or type(e).__name__}"
            return None


def rapl_domains(root: str = POWERCAP) -> list[Path]:
    """The package domains (intel-rapl:N, not their subzones intel-rapl:N:M)."""
    return sorted(Path(p) for p in glob.glob(os.path.join(root, "intel-rapl:*")) if p.count(":") == 1)


class CpuEnergy:
    def __init__(self, node_reader: bool, root: str = POWERCAP):
        self.domains, self.why = [], None
        self._last: dict = {}
        self.total = 0.0
        if not node_reader:
            self.why = "read by local rank 0 of each node"
            return
        found = rapl_domains(root)
        if not found:
            self.why = f"no RAPL domain under {root}"
            return
        for d in found:
            try:
                value = int((d / "energy_uj").read_text())
                top = int((d / "max_energy_range_uj").read_text())
            except (OSError, ValueError) as e:
                self.why = f"{d / 'energy_uj'}: {getattr(e, 'strerror', None) or e}"
                self.domains = []
                return
            self.domains.append((d, top))
            self._last[d] = value

    def read(self) -> float | None:
        """Joules used by the node's packages since this meter started (wraps counted), or None."""
        if not self.domains:
            return None
        for d, top in self.domains:
            try:
                value = int((d / "energy_uj").read_text())
            except (OSError, ValueError) as e:
                self.domains, self.why = [], f"{d / 'energy_uj'}: {getattr(e, 'strerror', None) or e}"
                return None
            step = value - self._last[d]
            self.total += (step if step >= 0 else step + top) / 1e6
            self._last[d] = value
        return self.total
