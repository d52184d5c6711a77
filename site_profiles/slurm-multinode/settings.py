"""ReFrame site profile `slurm-multinode`: a 3-node Slurm cluster on this machine
(tests/slurm/multinode.sh: each node its own network, host name and node-local scratch).

    tests/slurm/multinode.sh start /tmp/hpckit-multi 3
    tests/slurm/multinode.sh exec /tmp/hpckit-multi env HPCKIT_STAGE_DIR=/tmp/hpckit-multi/scratch \
        .venv/bin/reframe -C site_profiles/slurm-multinode/settings.py -c reframe_checks/ -r
    tests/slurm/multinode.sh stop /tmp/hpckit-multi

ReFrame runs on the login node (`exec`), submits with sbatch, polls squeue; the job's
script runs on the first node and launches each training with `srun` on 3 tasks, one per
node: a real 3-node torch.distributed / tf.distribute run, each node staging its share of
the data into its own scratch (HPCKIT_STAGE_DIR: the same path on every node, a
different tmpfs on each). The local batch is 3 per rank (global batch 9; the 1-rank mini
runs use 8). On a real cluster: set HPCKIT_SLURM_PARTITION, HPCKIT_STAGE_DIR (node-local
storage) and, where nodes have several cores per rank, HPCKIT_RANKS_PER_NODE.

Partition extras: as site_profiles/slurm-local/settings.py.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from site_common import env, env_count, env_path, venv_configuration  # noqa: E402   site_profiles/site_common.py

PROFILE = os.path.basename(os.path.dirname(os.path.abspath(__file__)))
NODES = env_count('HPCKIT_NODES', 3, 'nodes', PROFILE)
RANKS_PER_NODE = env_count('HPCKIT_RANKS_PER_NODE', 1, 'ranks per node', PROFILE)

site_configuration = venv_configuration(
    __file__,
    descr=f'{NODES}-node Slurm cluster (tests/slurm/multinode.sh)',
    partitions=[{
        'name': 'batch',
        'descr': f'Slurm partition batch, {NODES} nodes x {RANKS_PER_NODE} ranks per run through srun',
        'scheduler': 'squeue',
        'launcher': 'srun',
        # --ntasks=ranks with --ntasks-per-node=ranks_per_node: Slurm spreads a training's
        # ranks over the nodes; the dataset jobs (one task) take one node
        'access': [f"--partition={env('HPCKIT_SLURM_PARTITION', 'batch')}"],
        # campaign: reframe_checks/campaign.py runs here too (3 instances x 1 rank: one per node)
        'features': ['mlperf', 'campaign'],
        'max_jobs': 1,
        'time_limit': '30m',
        'extras': {'ranks': NODES * RANKS_PER_NODE, 'ranks_per_node': RANKS_PER_NODE, 'local_batch_size': 3,
                   'stage_dir': env_path('HPCKIT_STAGE_DIR', '/tmp/hpckit-stage'),
                   # CosmoFlow evaluates an equal share per rank: the mini set's 128
                   # validation samples cut to 126, a multiple of the 3 ranks (logged as a --set)
                   'overrides': {'cosmoflow': [f'data.n_valid={128 // (NODES * RANKS_PER_NODE) * NODES * RANKS_PER_NODE}']}},
    }],
    # intra-op threads per rank: a node's cores shared by its ranks. The kit plans a node's
    # cores for its ranks, and each namespace "node" sees all of this machine's cores: the
    # tests give HPCKIT_OMP_NUM_THREADS=1, which venv_configuration passes as --threads too
    # (OMP_NUM_THREADS alone gives way to the kit's plan: 2 threads x 3 ranks on 2 cores
    # made the mini DeepCAM 11 min instead of about 1)
    omp_num_threads=str(max(1, (os.cpu_count() or 2) // RANKS_PER_NODE)),
    # a rank that exits non-zero ends the step: the others do not wait on it
    env_vars=[['SLURM_KILL_BAD_EXIT', '1']],
)
