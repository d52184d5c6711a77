"""Launcher detection and communicator choice (hpckit.common.dist), from launcher environments.

The environments below are the variables each launcher really sets (checked against srun
under the tests' Slurm cluster, mpirun of Open MPI 4.1 and torchrun); the real launches
are in test_multirank.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hpckit.common import dist
from hpckit.common.errors import KitError


def test_single_process_is_rank_0_of_1():
    r = dist.detect({})
    assert (r.rank, r.size, r.local_rank, r.local_size, r.node, r.nodes, r.launcher) == (0, 1, 0, 1, 0, 1, "none")


def test_torchrun():
    env = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1",
           "MASTER_ADDR": "node7", "MASTER_PORT": "29999"}
    r = dist.detect(env)
    assert (r.rank, r.size, r.local_rank, r.local_size, r.node, r.nodes) == (3, 4, 1, 2, 1, 2)
    assert (r.launcher, r.master_addr, r.master_port) == ("torchrun", "node7", 29999)


def test_openmpi_one_node_rendezvous_on_loopback():
    env = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
           "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "OMPI_MCA_ess_base_jobid": "123456"}
    r = dist.detect(env)
    assert (r.rank, r.size, r.node, r.nodes, r.launcher, r.master_addr) == (1, 2, 0, 1, "openmpi", "127.0.0.1")
    assert 20000 <= r.master_port < 40000
    assert dist.detect(env).master_port == r.master_port          # every rank derives the same port


def test_openmpi_several_nodes_needs_an_address():
    env = {"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "0",
           "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}
    with pytest.raises(KitError, match="MASTER_ADDR"):
        dist.detect(env)
    r = dist.detect({**env, "SLURM_JOB_NODELIST": "nid[0010-0011]"})   # mpirun inside an allocation
    assert (r.node, r.nodes, r.master_addr, r.node_hosts) == (1, 2, "nid0010", ("nid0010", "nid0011"))


def test_srun_step():
    env = {"SLURM_PROCID": "5", "SLURM_STEP_NUM_TASKS": "8", "SLURM_LOCALID": "1", "SLURM_NODEID": "2",
           "SLURM_STEP_NUM_NODES": "4", "SLURM_STEP_TASKS_PER_NODE": "2(x4)", "SLURM_STEP_NODELIST": "gpu[01-03,07]",
           "SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_LAUNCH_NODE_IPADDR": "10.0.0.1"}
    r = dist.detect(env)
    assert (r.rank, r.size, r.local_rank, r.local_size, r.node, r.nodes) == (5, 8, 1, 2, 2, 4)
    assert r.master_addr == "gpu01" and r.node_hosts == ("gpu01", "gpu02", "gpu03", "gpu07")


def test_batch_script_shell_is_not_a_rank():
    """sbatch -n 2 sets SLURM_PROCID=0 and SLURM_NTASKS=2 in the script itself: one process."""
    r = dist.detect({"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "vm"})
    assert (r.size, r.launcher) == (1, "none")


def test_pmi_and_pmix():
    r = dist.detect({"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"})
    assert (r.rank, r.size, r.launcher, r.master_addr) == (1, 2, "pmi", "127.0.0.1")
    r = dist.detect({"PMIX_RANK": "0", "PMIX_SIZE": "2"})
    assert (r.rank, r.size, r.launcher) == (0, 2, "pmix")
    with pytest.raises(KitError, match="PMIX_SIZE"):
        dist.detect({"PMIX_RANK": "0"})


@pytest.mark.parametrize("env, match", [
    ({"RANK": "2", "WORLD_SIZE": "2"}, "inconsistent"),
    ({"RANK": "x", "WORLD_SIZE": "2"}, "RANK='x' is not an integer"),
])
def test_bad_launcher_environment_is_one_line(env, match):
    with pytest.raises(KitError, match=match):
        dist.detect(env)


@pytest.mark.parametrize("spec, hosts", [
    ("vm", ["vm"]),
    ("nid[001-003,007],login1", ["nid001", "nid002", "nid003", "nid007", "login1"]),
    ("a[1-2]-ib,b", ["a1-ib", "a2-ib", "b"]),
])
def test_expand_hostlist(spec, hosts):
    assert dist.expand_hostlist(spec) == hosts


def test_choose():
    one, two = dist.Ranks(), dist.Ranks(rank=0, size=2, local_size=2)
    assert dist.choose("auto", "pytorch", one) == "none"
    assert dist.choose("auto", "pytorch", two) == "torch"
    assert dist.choose("auto", "tensorflow", two) == "tf"
    with pytest.raises(KitError, match="--dist tf needs --framework tensorflow"):
        dist.choose("tf", "pytorch", two)
    with pytest.raises(KitError, match="--dist torch needs --framework pytorch"):
        dist.choose("torch", "tensorflow", two)
    with pytest.raises(KitError, match="--dist none with 2 ranks"):
        dist.choose("none", "pytorch", two)


def test_horovod_for_tensorflow_is_refused_in_one_line():
    """The kit's Horovod is built for PyTorch only (it does not build against TF 2.21)."""
    with pytest.raises(KitError, match=r"--dist horovod: horovod.tensorflow is not importable here"):
        dist.choose("horovod", "tensorflow", dist.Ranks(size=2, local_size=2))


@pytest.mark.parametrize("nodes, per_node", [(1, 2), (2, 2), (3, 4), (4, 1)])
def test_node_and_rank_shares_partition_the_files(nodes, per_node):
    """Staging per node: node n stages every nodes-th file from n; its ranks split that
    share. Over all ranks every file is read exactly once, and a node's ranks read only
    what their node staged."""
    from hpckit.common.run import node_share, rank_share
    from hpckit.deepcam.data import DeepCamFiles

    files = DeepCamFiles("train", [Path(f"/d/data-{i:04d}.h5") for i in range(103)])
    seen = []
    for node in range(nodes):
        staged = node_share(files, dist.Ranks(node=node, nodes=nodes, size=nodes * per_node, local_size=per_node))
        for local in range(per_node):
            ranks = dist.Ranks(rank=node * per_node + local, size=nodes * per_node, local_rank=local,
                               local_size=per_node, node=node, nodes=nodes)
            mine = rank_share(staged, ranks).files
            assert set(mine) <= set(staged.files)
            seen += mine
    assert sorted(seen) == sorted(files.files)
