"""What recording a run's provenance costs (hpckit/common/provenance.py): `hpckit train`
collects it once, on rank 0, before run_start (outside the timed region). Prints the
median and largest seconds of each part and of the whole `collect`, over --repeat fresh
processes (the first call in a process pays for importlib.metadata's directory scans, as a
training does), with the machine's CPU flags and load.

    .venv/bin/python bench/provenance_cost.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PARTS = ("installed_packages", "kit", "frameworks", "spack_env", "container", "host", "cpu", "gpu", "collect")
CHILD = """
import json, time
from hpckit.common import provenance as p
out = {}
for name in %r:
    t = time.perf_counter(); getattr(p, name)(); out[name] = time.perf_counter() - t
print(json.dumps(out))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5, help="fresh processes (default 5)")
    args = ap.parse_args()
    if args.repeat < 1:
        print(f"provenance_cost: --repeat {args.repeat}: must be >= 1", file=sys.stderr)
        return 2
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO / "apps"), os.environ.get("PYTHONPATH"))
                                                        if p)}
    runs = []
    for _ in range(args.repeat):
        proc = subprocess.run([sys.executable, "-c", CHILD % (PARTS,)], capture_output=True, text=True, env=env,
                              timeout=300)
        if proc.returncode != 0:
            print(f"provenance_cost: the child failed: {proc.stderr.strip()[-500:]}", file=sys.stderr)
            return 1
        runs.append(json.loads(proc.stdout))
    from hpckit.common import cores
    flags = " ".join(sorted(f for f in cores.cpu_flags() if f in ("avx2", "avx512f", "avx512_bf16")))
    load = os.getloadavg()
    print(f"# CPU: {cores.cpu_model()}, {len(cores.allocation_cpus())} CPUs, flags {flags or 'none of avx2/avx512'}; "
          f"load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}; {args.repeat} fresh processes")
    print(f"{'part':<20} {'median s':>10} {'max s':>10}")
    for part in PARTS:
        values = [r[part] for r in runs]
        print(f"{part:<20} {statistics.median(values):>10.4f} {max(values):>10.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
