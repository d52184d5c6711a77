"""DeepCAM: train to the quality target (mean IoU), check compliance, time it.

The logic is in mlperf_base.py; the references are in the site profile's references.yaml.
"""

import reframe as rfm
from reframe.core.builtins import fixture, parameter

from mlperf_base import MLPerfDataset, MLPerfTraining


class DeepCAMData(MLPerfDataset):
    benchmark = 'deepcam'


@rfm.simple_test
class DeepCAMCheck(MLPerfTraining):
    descr = 'DeepCAM time to train, throughput and compliance'
    benchmark = 'deepcam'
    framework = parameter(['pytorch'])     # the reference is PyTorch only
    seed = 333                             # the reference's default; the rules want seed > 0
    dataset = fixture(DeepCAMData, scope='session')
