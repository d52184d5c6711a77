"""ReFrame site profile `a100`: NVIDIA A100 nodes, modelled on NERSC Perlmutter's GPU nodes.

Perlmutter (HPE Cray EX): 1x AMD EPYC 7763 (64 cores, 2 threads each), 256 GB DDR4,
4x NVIDIA A100-SXM4-40GB with NVLink 3, 4x Slingshot 11 NICs per node; Slurm, `srun`.
https://docs.nersc.gov/systems/perlmutter/architecture/

    spack env activate site_profiles/a100          # once built: spack install
    reframe -C site_profiles/a100/settings.py -c reframe_checks/ -r -p spack
    reframe -C site_profiles/a100/settings.py -c reframe_checks/ -r -p apptainer

What a site sets (environment variables, read when ReFrame loads this file):
  HPCKIT_ACCOUNT      Slurm account (-A); Perlmutter GPU accounts end in _g. Unset: none.
  HPCKIT_QOS          Slurm QOS (default: regular)
  HPCKIT_CONSTRAINT   Slurm constraint selecting the GPU nodes (default: gpu)
  HPCKIT_DATA         folder of cosmoflow/, deepcam/, oc20/, openfold/ (default: $PSCRATCH/mlperf-hpc)
  HPCKIT_STAGE_DIR    node-local staging folder (default: /tmp/hpckit-stage; Perlmutter's
                      GPU nodes have no local disk, /tmp is memory-backed)
  HPCKIT_IMAGE        the Apptainer image (default: $HPCKIT_DATA/images/hpckit-a100-0.1.0.sif)
  HPCKIT_SARUS_IMAGE  the image for Sarus (default: hpckit/a100:0.1.0)
  HPCKIT_PODMAN_HPC_IMAGE  the image for podman-hpc, migrated to $SQUASH_DIR
                      (default: localhost/hpckit:a100)
  HPCKIT_ENROOT_IMAGE the enroot image for pyxis (default: $HPCKIT_DATA/images/hpckit-a100-0.1.0.sqsh)
  HPCKIT_MODULES_SYSTEM  ReFrame modules system (default: nomod; lmod on Perlmutter)
  HPCKIT_RFM_PREFIX   where ReFrame writes stage/, output/, perflogs/ (default: the repo)

Perlmutter itself runs containers with Shifter and podman-hpc (`-p podman-hpc`: `srun
podman-hpc run --gpu [--mpi] ...`), not Sarus; the `sarus` environment serves A100 sites
that have Sarus (CSCS), `pyxis` those with enroot + pyxis (`srun --container-image=...`, as
NVIDIA's MLPerf submission scripts launch). Where a site lacks one, select the others:
-p 'spack|apptainer'.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from site_common import env, target_configuration  # noqa: E402   site_profiles/site_common.py

site_configuration = target_configuration(
    __file__,
    descr='NVIDIA A100 nodes, modelled on NERSC Perlmutter GPU (site profile a100)',
    hostnames=[r'perlmutter', r'login\d+', r'nid\d+'],
    data=os.path.join(env('PSCRATCH', '/pscratch/sd/u/user'), 'mlperf-hpc'),
    runtimes=['apptainer', 'sarus', 'podman-hpc', 'pyxis'],
    platforms=['Shifter'],     # Perlmutter's own runtime; the kit's images run with it too
    ranks_per_node=4,          # one rank per GPU
    partition={
        'name': 'gpu',
        'descr': '4x A100-SXM4-40GB, 1x EPYC 7763 per node',
        'launcher': 'srun',
        'access': [f'--constraint={env("HPCKIT_CONSTRAINT", "gpu")}',
                   f'--qos={env("HPCKIT_QOS", "regular")}'],
        'features': ['mlperf', 'gpu', 'cuda'],
        'max_jobs': 8,
        'time_limit': '2h',
        'processor': {'arch': 'zen3', 'num_cpus': 128, 'num_cpus_per_core': 2,
                      'num_sockets': 1, 'num_cpus_per_socket': 128},
        'devices': [{'type': 'gpu', 'arch': 'sm_80',
                     'model': 'NVIDIA A100-SXM4-40GB', 'num_devices': 4}],
        'resources': [{'name': 'gpu', 'options': ['--gpus-per-node={num_gpus_per_node}']}],
    },
)
