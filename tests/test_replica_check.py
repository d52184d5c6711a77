"""The end-of-run replica check can fail: two real gloo ranks (tests/ranks.py) that
pass different weight fingerprints disagree, equal ones agree."""

from __future__ import annotations

import pytest

from ranks import run_ranks


def _rank(rank, port, fingerprints):
    import torch
    from hpckit.common import dist
    from hpckit.common.run import replicas_agree
    n = len(fingerprints)
    ranks = dist.Ranks(rank=rank, size=n, local_rank=rank, local_size=n, master_port=port)
    comm = dist.TorchComm(ranks, torch.device("cpu"), timeout_s=30)
    try:
        return replicas_agree(comm, fingerprints[rank])[0]
    finally:
        comm.close()


@pytest.mark.parametrize("fingerprints, agree", [
    ((1234.5678, 1234.5678), True),
    ((1234.5678, 1234.5679), False),      # one weight off in the 8th digit: not averaged
    # equal on 3 ranks, where E[f^2] - E[f]^2 left 9.8e-4 of rounding (a 3-rank DeepCAM run
    # was failed as "not averaged" for it)
    ((58727.12255141469,) * 3, True),
    ((58727.12255141469, 58727.12255141469, 58727.1236), False),   # 1.8e-8 apart
])
def test_replicas_agree_only_when_equal(fingerprints, agree):
    assert run_ranks(_rank, len(fingerprints), fingerprints) == [agree] * len(fingerprints)
