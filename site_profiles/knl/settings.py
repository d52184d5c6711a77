"""ReFrame site profile `knl`: Intel Xeon Phi (KNL) nodes, modelled on NERSC Cori's KNL partition.

Cori KNL (Cray XC40): 1x Intel Xeon Phi 7250 (68 cores, 4 threads each), 96 GB DDR4 and
16 GB MCDRAM (quad,cache), Aries dragonfly, no local disk; Slurm, `srun`, Cray MPICH.
https://docs.nersc.gov/systems/cori/ (retired 2023)

    spack env activate site_profiles/knl           # once built: spack install
    reframe -C site_profiles/knl/settings.py -c reframe_checks/ -r -p spack
    reframe -C site_profiles/knl/settings.py -c reframe_checks/ -r -p apptainer

What a site sets (environment variables, read when ReFrame loads this file):
  HPCKIT_ACCOUNT      Slurm account (-A). Unset: none.
  HPCKIT_QOS          Slurm QOS (default: regular)
  HPCKIT_CONSTRAINT   Slurm constraint selecting the KNL nodes (default: knl,quad,cache)
  HPCKIT_DATA         folder of cosmoflow/, deepcam/, oc20/, openfold/ (default: $SCRATCH/mlperf-hpc)
  HPCKIT_STAGE_DIR    node-local staging folder (default: /tmp/hpckit-stage; KNL nodes
                      have no disk, /tmp is memory-backed)
  HPCKIT_IMAGE        the Apptainer image (default: $HPCKIT_DATA/images/hpckit-knl-0.1.0.sif)
  HPCKIT_MODULES_SYSTEM  ReFrame modules system (default: nomod)
  HPCKIT_RFM_PREFIX   where ReFrame writes stage/, output/, perflogs/ (default: the repo)

Containers: Cori ran Shifter (listed as a platform); the `apptainer` environment runs the
kit's image where Apptainer is installed. There is no Sarus at NERSC, hence no `sarus`.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from site_common import env, target_configuration  # noqa: E402   site_profiles/site_common.py

site_configuration = target_configuration(
    __file__,
    descr='Intel Xeon Phi 7250 nodes, modelled on NERSC Cori KNL (site profile knl)',
    hostnames=[r'cori\d+', r'nid\d+'],
    data=os.path.join(env('SCRATCH', '/global/cscratch1/sd/user'), 'mlperf-hpc'),
    platforms=['Shifter'],
    # one rank per node with all 68 cores' threads, as the Cori KNL runs
    ranks_per_node=1,
    partition={
        'name': 'knl',
        'descr': '1x Xeon Phi 7250 (68 cores) per node, quad,cache',
        'launcher': 'srun',
        'access': [f'--constraint={env("HPCKIT_CONSTRAINT", "knl,quad,cache")}',
                   f'--qos={env("HPCKIT_QOS", "regular")}'],
        'features': ['mlperf', 'cpu'],
        'max_jobs': 8,
        'time_limit': '8h',
        'processor': {'arch': 'mic_knl', 'num_cpus': 272, 'num_cpus_per_core': 4,
                      'num_sockets': 1, 'num_cpus_per_socket': 272},
    },
)
