"""Throughput (weak-scaling) campaigns: M model instances of S ranks each in one launch,
reporting number of models, time_to_train_all and instance scale (mlperf_base.py).

Opt-in (valid on partitions with the `campaign` feature); on the local profile:

    reframe -C site_profiles/local/settings.py -c reframe_checks/campaign.py -r \\
        --system local:mpi -S valid_systems=local:mpi

M and S: `-P instances=5 -P instance_ranks=2` (ReFrame's --parameterize).
"""

import reframe as rfm
from reframe.core.builtins import fixture, parameter

from mlperf_base import MLPerfCampaign, MLPerfDataset


class DeepCAMCampaignData(MLPerfDataset):
    benchmark = 'deepcam'


@rfm.simple_test
class DeepCAMCampaign(MLPerfCampaign):
    descr = 'DeepCAM throughput campaign: number of models, time_to_train_all, instance scale'
    benchmark = 'deepcam'
    framework = parameter(['pytorch'])
    instances = parameter([3])        # M
    instance_ranks = parameter([1])   # S
    seed = 333
    dataset = fixture(DeepCAMCampaignData, scope='session')
