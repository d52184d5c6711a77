"""DeepCAM's batch-norm running statistics across real ranks (torch.distributed, gloo): each
rank keeps its own during the epoch (DDP broadcast_buffers=False) and, after the epoch,
the evaluated model's running mean and variance are the mean over the ranks, on every rank,
as the reference's BatchNormStatsSynchronize (mlcommons/hpc@2c627d4 utils/bnstats.py)."""

from __future__ import annotations

import torch

from hpckit.common.dist import Ranks, TorchComm
from hpckit.deepcam.train import Trainer
from ranks import run_ranks


def _rank(rank: int, port: int):
    torch.set_num_threads(1)
    ranks = Ranks(rank=rank, size=2, local_rank=rank, local_size=2, master_port=port)
    comm = TorchComm(ranks, torch.device("cpu"), timeout_s=60)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.BatchNorm2d(4))
    ddp = comm.wrap_model(model, broadcast_buffers=False)
    ddp.train()
    torch.manual_seed(100 + rank)     # different data on each rank: different batch statistics
    ddp(torch.randn(2, 3, 8, 8) * (1 + rank) + rank)
    before = [b.clone() for m in model.modules() for b in (getattr(m, "running_mean", None), getattr(m, "running_var", None))
              if b is not None]
    trainer = Trainer.__new__(Trainer)     # only its batch-norm handling, on this model
    trainer.comm, trainer.model = comm, model
    trainer.bn_stats = [b for m in model.modules() for name in ("running_mean", "running_var")
                        if isinstance(b := getattr(m, name, None), torch.Tensor)]
    trainer.average_bn_stats()
    after = [b.clone() for b in trainer.bn_stats]
    comm.close()
    return [t.tolist() for t in before], [t.tolist() for t in after]


def test_running_stats_are_the_rank_average_on_every_rank():
    (b0, a0), (b1, a1) = run_ranks(_rank, 2)
    assert len(b0) == 4
    assert any(torch.tensor(x).ne(torch.tensor(y)).any() for x, y in zip(b0, b1)), \
        "the ranks' statistics were equal before averaging: broadcast_buffers is not off"
    for x0, x1, y0, y1 in zip(b0, b1, a0, a1):
        expected = (torch.tensor(x0, dtype=torch.float64) + torch.tensor(x1, dtype=torch.float64)) / 2
        assert torch.allclose(torch.tensor(y0, dtype=torch.float64), expected, atol=1e-6)
        assert y0 == y1
