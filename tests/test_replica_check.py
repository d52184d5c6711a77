"""The end-of-run replica check can fail: two real gloo ranks (tests/ranks.py) that
pass different weight fingerprints disagree, equal ones agree."""

from __future__ import annotations

import pytest

from ranks import run_ranks


def _rank(rank, port, fingerprints):
    import torch
    from hpckit.common import dist
    from hpckit.common.run import replicas_agree
    ranks = dist.Ranks(rank=rank, size=2, local_rank=rank, local_size=2, master_port=port)
    comm = dist.TorchComm(ranks, torch.device("cpu"), timeout_s=30)
    try:
        return replicas_agree(comm, fingerprints[rank])[0]
    finally:
        comm.close()


@pytest.mark.parametrize("fingerprints, agree", [
    ((1234.5678, 1234.5678), True),
    ((1234.5678, 1234.5679), False),      # one weight off in the 8th digit: not averaged
])
def test_replicas_agree_only_when_equal(fingerprints, agree):
    assert run_ranks(_rank, 2, fingerprints) == [agree, agree]
