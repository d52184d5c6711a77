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
  HPCKIT_DATA         folder of cosmoflow/, deepcam/, oc20/, openfold/ (default: /data/<group>/mlperf-hpc,
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

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from site_common import account, env, target_configuration  # noqa: E402   site_profiles/site_common.py

site_configuration = target_configuration(
    __file__,
    descr='Fujitsu A64FX nodes, modelled on RIKEN Fugaku (site profile a64fx)',
    hostnames=[r'fn01sv\d+', r'fugaku'],
    data=f'/data/{account() or "group"}/mlperf-hpc',
    stage_dir='$PJM_LOCALTMP/hpckit-stage',
    # one rank per CMG (4 NUMA domains per A64FX), as Fugaku's CosmoFlow runs
    ranks_per_node=4,
    partition={
        'name': 'compute',
        'descr': '1x A64FX (48 cores), 32 GiB HBM2 per node',
        'launcher': 'mpiexec',
        'access': [f'--partition={env("HPCKIT_RSCGRP", "small")}'],
        'features': ['mlperf', 'cpu'],
        'max_jobs': 8,
        'time_limit': '12h',
        'processor': {'arch': 'a64fx', 'num_cpus': 48, 'num_cpus_per_core': 1,
                      'num_sockets': 1, 'num_cpus_per_socket': 48},
    },
)
