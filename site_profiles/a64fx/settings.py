"""ReFrame site profile `a64fx`: Fujitsu A64FX nodes, modelled on RIKEN Fugaku.

Fugaku: 1x Fujitsu A64FX (48 compute cores + 2/4 assistant cores, SVE 512-bit), 32 GiB
HBM2, Tofu interconnect D; jobs go through Fujitsu's PJM (`pjsub`), MPI programs start
with `mpiexec` (Fujitsu MPI). https://www.r-ccs.riken.jp/en/fugaku/about/
Fugaku's CosmoFlow results are in the MLPerf HPC v0.7 paper (512 A64FX nodes).

    spack env activate site_profiles/a64fx         # once built: spack install
    reframe -C site_profiles/a64fx/settings.py -c reframe_checks/ -r -p spack
    reframe -C site_profiles/a64fx/settings.py -c reframe_checks/ -r -p apptainer

Scheduler: ReFrame 4.10 has no PJM backend (reframe/core/schedulers: slurm, pbs, sge,
lsf, oar, flux, ssh, local), so the partition is declared with the `slurm` scheduler and
the `mpiexec` launcher; `access` carries the PJM resource group and group name as the
site variables below. A site on PJM needs a PJM scheduler backend for ReFrame (or its
Slurm-compatible front end); the rest of the profile does not change.

What a site sets (environment variables, read when ReFrame loads this file):
  HPCKIT_ACCOUNT      the group (PJM -g, Slurm --account). Unset: none.
  HPCKIT_RSCGRP       the resource group / partition (default: small)
  HPCKIT_DATA         folder holding cosmoflow/ and deepcam/ (default: /data/<group>/mlperf-hpc,
                      Fugaku's second-layer storage)
  HPCKIT_STAGE_DIR    node-local staging folder (default: $PJM_LOCALTMP/hpckit-stage, the
                      node-temporary area of the first-layer storage, expanded in the job)
  HPCKIT_IMAGE        the Apptainer image (default: $HPCKIT_DATA/images/hpckit-a64fx-0.1.0.sif)
  HPCKIT_MODULES_SYSTEM  ReFrame modules system (default: nomod)
  HPCKIT_RFM_PREFIX   where ReFrame writes stage/, output/, perflogs/ (default: the repo)

Containers: Fugaku provides Singularity/Apptainer; there is no Sarus, hence no `sarus`.
"""

import os
import sys

_here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(_here))   # site_profiles/site_common.py, shared
from site_common import LOGGING, STORAGE, hpckit_environments, run_extras  # noqa: E402
REPO = os.path.dirname(os.path.dirname(_here))

# ReFrame 4.10.4 rejects general/reference_prefix (see site_profiles/local/settings.py):
# the checks' `$ref: references.yaml` is found through the environment variable instead.
os.environ.setdefault('RFM_REFERENCE_PREFIX', _here)

_env = os.environ.get
NODES = int(_env('HPCKIT_NODES', '1'))   # nodes per training run
ACCOUNT = _env('HPCKIT_ACCOUNT', '')
DATA = _env('HPCKIT_DATA', f'/data/{ACCOUNT or "group"}/mlperf-hpc')
STAGE_DIR = _env('HPCKIT_STAGE_DIR', '$PJM_LOCALTMP/hpckit-stage')
IMAGE = _env('HPCKIT_IMAGE', os.path.join(DATA, 'images', 'hpckit-a64fx-0.1.0.sif'))

site_configuration = {
    'systems': [
        {
            'name': 'a64fx',
            'descr': 'Fujitsu A64FX nodes, modelled on RIKEN Fugaku (site profile a64fx)',
            'hostnames': [r'fn01sv\d+', r'fugaku'],
            'modules_system': _env('HPCKIT_MODULES_SYSTEM', 'nomod'),
            'prefix': _env('HPCKIT_RFM_PREFIX', REPO),
            'partitions': [
                {
                    'name': 'compute',
                    'descr': '1x A64FX (48 cores), 32 GiB HBM2 per node',
                    'scheduler': 'slurm',
                    'launcher': 'mpiexec',
                    'access': [f'--partition={_env("HPCKIT_RSCGRP", "small")}']
                              + ([f'--account={ACCOUNT}'] if ACCOUNT else []),
                    'environs': ['spack', 'apptainer'],
                    'features': ['mlperf', 'cpu'],
                    'max_jobs': 8,
                    'time_limit': '12h',
                    'processor': {'arch': 'a64fx', 'num_cpus': 48, 'num_cpus_per_core': 1,
                                  'num_sockets': 1, 'num_cpus_per_socket': 48},
                    'container_platforms': [
                        {'type': 'Apptainer', 'default': True},
                    ],
                    # ranks of one MLPerf run: one rank per CMG (4 NUMA domains per A64FX), as Fugaku's CosmoFlow runs
                    'extras': run_extras(DATA, STAGE_DIR, ranks_per_node=4, nodes=NODES),
                },
            ],
        },
    ],
    'environments': hpckit_environments(_here, IMAGE),
    'logging': LOGGING,
    'storage': STORAGE,
}
