"""Every rank takes the same number of training steps per epoch, whatever the rank count:
the real share functions (common/run.py) on the real dataset sizes, for 1 to 4,096 ranks.
The splits here are index ranges (slicing a range is O(1)), shaped like the kit's SplitFiles
and DeepCamFiles: subset() and shard() as they define them."""

from __future__ import annotations

import pytest

from hpckit.common.dist import Ranks
from hpckit.common.errors import KitError
from hpckit.common.run import EpochSampler, equal_train_split, node_share, rank_share
from hpckit.cosmoflow.data import SplitFiles
from hpckit.deepcam.data import DeepCamFiles


class RangeSplit:
    def __init__(self, r: range):
        self.r = r

    def __len__(self):
        return len(self.r)

    def subset(self, indices):
        return RangeSplit(self.r[indices.start:indices.stop:indices.step])

    def shard(self, rank, size):   # as SplitFiles.shard and DeepCamFiles.shard: every size-th from rank
        return self.subset(range(rank, len(self.r), size))


def test_range_split_shards_as_the_kit_splits_do():
    files = [f"f{i}" for i in range(103)]
    for real in (SplitFiles("train", "tfrecord", files, [], "GZIP"), DeepCamFiles("train", files)):
        for rank, size in ((0, 1), (2, 7), (6, 7), (1, 3)):
            assert real.shard(rank, size).files == [files[i] for i in RangeSplit(range(103)).shard(rank, size).r]
        assert real.subset(range(50)).files == files[:50] and len(real) == 103


# (benchmark, training samples of the real dataset, local batch x accumulation of the reference config)
REAL = [("cosmoflow", 524_288, 4), ("deepcam", 121_266, 2)]


@pytest.mark.parametrize("benchmark, n_train, unit", REAL)
def test_equal_steps_on_every_rank_for_1_to_4096_ranks(benchmark, n_train, unit):
    for size in range(1, 4097):
        local = next(l for l in (8, 4, 2, 1) if size % l == 0)   # ranks per node: the launcher's block layout
        nodes = size // local
        split, per_rank, dropped = equal_train_split(RangeSplit(range(n_train)), Ranks(size=size), unit)
        assert per_rank % unit == 0 and 0 <= dropped < size * unit and per_rank * size + dropped == n_train
        taken = set()
        for rank in sorted({0, size - 1, size // 2, local - 1}):
            r = Ranks(rank=rank, size=size, local_rank=rank % local, local_size=local, node=rank // local, nodes=nodes)
            mine = rank_share(node_share(split, r), r)
            assert len(split) == n_train and len(mine) >= per_rank, (benchmark, size, rank, len(mine), per_rank)
            # what a rank reads each epoch (MLPerfRun.stage_and_shard): staged, its local
            # shard of the node's pool; not staged, its shard of the whole split
            staged = EpochSampler(len(node_share(split, r)), r.local_rank, r.local_size, per_rank, 1, True)
            unstaged = EpochSampler(len(split), r.rank, r.size, per_rank, 1, True)
            assert len(staged) == len(unstaged) == per_rank, (benchmark, size, rank)
            assert not taken & set(mine.r[:3]), "two ranks read the same file"
            taken |= set(mine.r[:3])


def test_the_2048_rank_deepcam_case_of_the_audit():
    """121,266 samples over 2,048 ranks: 58 samples (29 steps of 2) on every rank, 2,482 left out
    of each epoch, where a plain rank::size shard gave 434 ranks 60 samples and 1,614 ranks 59."""
    plain = [len(RangeSplit(range(121_266)).shard(r, 2048)) for r in range(2048)]
    assert (plain.count(60), plain.count(59)) == (434, 1614)
    _, per_rank, dropped = equal_train_split(RangeSplit(range(121_266)), Ranks(size=2048), 2)
    assert (per_rank, dropped) == (58, 121_266 - 58 * 2048)


def test_batch_larger_than_a_ranks_share_is_refused():
    with pytest.raises(KitError, match=r"config key 'data.batch_size': a rank's step takes 8 samples, more than "
                                       r"its share of the 20 training samples over 4 ranks"):
        equal_train_split(RangeSplit(range(20)), Ranks(size=4), 8)


@pytest.mark.parametrize("pool, count, per_rank", [(64, 4, 16), (103, 7, 14), (238, 3, 78), (10, 1, 10)])
def test_each_epoch_a_fresh_permutation_then_the_ranks_shards(pool, count, per_rank):
    """The reference's order: every epoch the whole pool is permuted (the same permutation
    on every rank: seeded by the run's seed and the epoch), then rank::count; the ranks'
    shards are disjoint, equally long, and change from epoch to epoch."""
    ranks = [EpochSampler(pool, i, count, per_rank, seed=7, shuffle=True) for i in range(count)]
    seen_epochs = []
    for epoch in range(1, 4):
        shards = [list(iter(s)) for s in ranks]         # one pass = one epoch, on every rank
        assert all(s.epoch == epoch for s in ranks)
        assert all(len(sh) == per_rank for sh in shards)
        flat = [i for sh in shards for i in sh]
        assert len(set(flat)) == len(flat) == per_rank * count and set(flat) <= set(range(pool))
        # rank 0's shard is every count-th element of one permutation of the pool
        assert shards[0] == EpochSampler(pool, 0, count, per_rank, 7, True).indices(epoch)
        seen_epochs.append(shards)
    if count < pool:
        assert seen_epochs[0][0] != seen_epochs[1][0] != seen_epochs[2][0]   # reshuffled every epoch
    # another seed, another order; no shuffling: the static shard pool[i::count]
    assert EpochSampler(pool, 0, count, per_rank, 8, True).indices(1) != seen_epochs[0][0] or count == pool
    plain = EpochSampler(pool, 1 % count, count, None, 7, False)
    assert list(iter(plain)) == list(range(1 % count, pool, count)) == list(iter(plain))


def test_a_rank_reads_beyond_its_static_shard_over_the_epochs():
    """Over the epochs a rank sees files of the whole pool, not a fixed 1/count of it (what
    a static rank::size shard reshuffled locally would give)."""
    s = EpochSampler(1000, 3, 8, 125, seed=1, shuffle=True)
    seen = set()
    for _ in range(10):
        seen |= set(iter(s))
    assert len(seen) > 700 and not seen <= set(range(3, 1000, 8))


def test_the_left_out_samples_change_every_epoch_so_every_file_is_trained_on():
    """As the reference's DistributedSampler(drop_last=True): the remainder is the tail of each
    epoch's permutation, not a fixed set of files. 103 files over 4 ranks, batch 4: 96 per
    epoch, 7 left out, a different 7 each epoch; over 20 epochs every file is read."""
    split, per_rank, left_out = equal_train_split(RangeSplit(range(103)), Ranks(size=4), 4)
    assert (len(split), per_rank, left_out) == (103, 24, 7)
    ranks = [EpochSampler(len(split), r, 4, per_rank, seed=5, shuffle=True) for r in range(4)]
    seen, outs = set(), []
    for _ in range(20):
        epoch = [i for s in ranks for i in iter(s)]
        assert len(epoch) == len(set(epoch)) == 96
        outs.append(frozenset(range(103)) - set(epoch))
        seen |= set(epoch)
    assert seen == set(range(103))
    assert len(set(outs)) > 1
