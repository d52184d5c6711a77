"""OpenFold (AlphaFold2): train to the quality target (avg lDDT-Ca), check compliance, time it.

The logic is in mlperf_base.py; the references are in the site profile's references.yaml.
OpenFold counts no epochs: its `epochs` figure and a not-converged FAIL count train/eval
cycles (val_every_iters steps, then an evaluation). The closed full-size run starts from the
reference's checkpoint: `-S config=reference -S OpenFoldCheck.checkpoint=FILE`
(mlperf_hpc_openfold_resumable_checkpoint.pt); the mini run starts from its initialisation.
Sabotage: `-S OpenFoldData.shuffle_labels=true` (each training chain's structure built from
another, random sequence) or `-S overrides=optimizer.base_lr=0` FAIL as not converged (the
shuffled structures by the margin configs/mini.yaml records).
"""

import reframe as rfm
from reframe.core.builtins import fixture, parameter

from mlperf_base import MLPerfDataset, MLPerfTraining


class OpenFoldData(MLPerfDataset):
    benchmark = 'openfold'
    layout = ['pdb_mmcif/processed/dicts', 'open_protein_set/processed/pdb_alignments']


@rfm.simple_test
class OpenFoldCheck(MLPerfTraining):
    descr = 'OpenFold time to train, throughput and compliance'
    benchmark = 'openfold'
    framework = parameter(['pytorch'])     # the reference is PyTorch only
    # a seed configs/mini.yaml's target was measured with (its curves), not an unmeasured one: on
    # the data of 2026-11-27 seed 0 reached that target only in cycle 18 of 20, seed 1 in 12
    seed = 1
    # the mini model (chains of 12-16 residues, 32 MSA channels) is too small to share among
    # threads: on 2 idle cores one thread (and a loader worker) reached the target in 2 min 10 s,
    # two threads in 2 min 28 s (tests/test_openfold_train.py FAST); beside another busy
    # process two threads took 190 s a train/eval cycle, one thread 9 s
    threads = {'mini': 1}
    dataset = fixture(OpenFoldData, scope='session')
