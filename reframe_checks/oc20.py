"""OpenCatalyst (OC20, DimeNet++): train to the quality target (forces MAE), check compliance, time it.

The logic is in mlperf_base.py; the references are in the site profile's references.yaml.
Sabotage: `-S OC20Data.shuffle_labels=true` (each structure's forces permuted among its free
atoms) or `-S overrides=optimizer.lr=0` FAIL as not converged.
"""

import reframe as rfm
from reframe.core.builtins import fixture, parameter

from mlperf_base import MLPerfDataset, MLPerfTraining


class OC20Data(MLPerfDataset):
    benchmark = 'oc20'


@rfm.simple_test
class OC20Check(MLPerfTraining):
    descr = 'OC20 time to train, throughput and compliance'
    benchmark = 'oc20'
    framework = parameter(['pytorch'])     # the reference is PyTorch only
    dataset = fixture(OC20Data, scope='session')
