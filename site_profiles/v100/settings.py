"""ReFrame site profile `v100`: NVIDIA V100 nodes, modelled on NERSC Cori-GPU ("cgpu").

Cori-GPU: 2x Intel Xeon Gold 6148 (20 cores, 2 threads each), 384 GB DDR4, 8x NVIDIA
V100-SXM2 (NVLink hybrid cube-mesh), 4x dual-port EDR InfiniBand, 930 GB node-local NVMe;
Slurm, `srun` (jobs submitted after `module load cgpu`). This is the system of LBNL's
MLPerf HPC v0.7 results (system description corigpu_n64_tf1.15.0.json).
https://docs-dev.nersc.gov/cgpu/hardware/

    spack env activate site_profiles/v100          # once built: spack install
    reframe -C site_profiles/v100/settings.py -c reframe_checks/ -r -p spack
    reframe -C site_profiles/v100/settings.py -c reframe_checks/ -r -p apptainer

What a site sets (environment variables, read when ReFrame loads this file):
  HPCKIT_ACCOUNT      Slurm account (-A). Unset: none.
  HPCKIT_QOS          Slurm QOS (default: regular)
  HPCKIT_CONSTRAINT   Slurm constraint selecting the GPU nodes (default: gpu)
  HPCKIT_DATA         folder of cosmoflow/, deepcam/, oc20/, openfold/ (default: $SCRATCH/mlperf-hpc)
  HPCKIT_STAGE_DIR    node-local staging folder (default: /tmp/hpckit-stage, the NVMe)
  HPCKIT_IMAGE        the Apptainer image (default: $HPCKIT_DATA/images/hpckit-v100-0.1.0.sif)
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
    descr='NVIDIA V100 nodes, modelled on NERSC Cori-GPU (site profile v100)',
    hostnames=[r'cori\d+', r'cgpu\d+'],
    data=os.path.join(env('SCRATCH', '/global/cscratch1/sd/user'), 'mlperf-hpc'),
    platforms=['Shifter'],
    ranks_per_node=8,          # one rank per GPU
    partition={
        'name': 'gpu',
        'descr': '8x V100-SXM2-16GB, 2x Xeon Gold 6148 per node',
        'launcher': 'srun',
        'access': [f'--constraint={env("HPCKIT_CONSTRAINT", "gpu")}',
                   f'--qos={env("HPCKIT_QOS", "regular")}'],
        'features': ['mlperf', 'gpu', 'cuda'],
        'max_jobs': 4,
        'time_limit': '4h',
        'processor': {'arch': 'skylake_avx512', 'num_cpus': 80, 'num_cpus_per_core': 2,
                      'num_sockets': 2, 'num_cpus_per_socket': 40},
        'devices': [{'type': 'gpu', 'arch': 'sm_70',
                     'model': 'NVIDIA V100-SXM2-16GB', 'num_devices': 8}],
        'resources': [{'name': 'gpu', 'options': ['--gpus-per-node={num_gpus_per_node}']}],
    },
)
