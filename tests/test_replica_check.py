"""The end-of-run replica check can fail: two real gloo ranks (torch.multiprocessing) that
pass different weight fingerprints disagree, equal ones agree."""

from __future__ import annotations

import socket

import pytest
import torch.multiprocessing as mp


def _rank(rank, port, fingerprints, results):
    import torch
    from hpckit.common import dist
    from hpckit.common.run import replicas_agree
    ranks = dist.Ranks(rank=rank, size=2, local_rank=rank, local_size=2, master_port=port)
    comm = dist.TorchComm(ranks, torch.device("cpu"), timeout_s=30)
    try:
        results[rank] = replicas_agree(comm, fingerprints[rank])[0]
    finally:
        comm.close()


@pytest.mark.parametrize("fingerprints, agree", [
    ((1234.5678, 1234.5678), True),
    ((1234.5678, 1234.5679), False),      # one weight off in the 8th digit: not averaged
])
def test_replicas_agree_only_when_equal(fingerprints, agree):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_rank, args=(port, fingerprints, results), nprocs=2, join=True)
        assert dict(results) == {0: agree, 1: agree}
