"""CosmoFlow: train to the quality target with each framework, check compliance, time it.

The logic is in mlperf_base.py; the references are in the site profile's references.yaml.
"""

import reframe as rfm
from reframe.core.builtins import fixture, parameter

from mlperf_base import MLPerfDataset, MLPerfTraining


class CosmoFlowData(MLPerfDataset):
    benchmark = 'cosmoflow'


@rfm.simple_test
class CosmoFlowCheck(MLPerfTraining):
    descr = 'CosmoFlow time to train, throughput and compliance'
    benchmark = 'cosmoflow'
    framework = parameter(['tensorflow', 'pytorch'])
    dataset = fixture(CosmoFlowData, scope='session')
