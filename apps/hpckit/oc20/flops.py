"""One training sample's forward + backward for the FLOP count (common/flops.py).

A graph network's FLOPs follow its graph (atoms, edges, triplets), so they are counted on
real tensors: one synthetic structure of the config's size (data.synthetic, seed 0), its
graph as the reference's preprocessing builds it, the model's forward (energy, forces by
autograd) and the backward of the force loss. FlopCounterMode counts the matrix products;
the per-edge and per-triplet element-wise work (bases, scatters) is not counted.
"""

from __future__ import annotations


def flops_sample(cfg: dict):
    import numpy as np
    from hpckit.oc20 import synthetic
    from hpckit.oc20.data import collate
    from hpckit.oc20.model import build_model

    structure = synthetic.make_structure(synthetic.Shape.of(cfg), np.random.default_rng(0))
    batch = collate([synthetic.to_fields(structure, 0, 0)])
    model = build_model(cfg)
    model.train()

    def step():
        _, forces = model(batch)
        forces.float().abs().sum().backward()

    return model, step
