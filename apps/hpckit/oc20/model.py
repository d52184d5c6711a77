"""DimeNet++ as the OC20 reference trains it, in plain PyTorch (no torch-scatter, torch-sparse,
torch-cluster or PyG: none has a wheel that installs here).

Followed: mlcommons/hpc@2c627d4 open_catalyst/ocpmodels/models/dimenet_plus_plus.py (the
model, `DimeNetPlusPlusWrap`), ocpmodels/common/utils.py (`get_pbc_distances` :454-492,
`radius_graph_pbc` :495-676), ocpmodels/preprocessing/atoms_to_graphs.py (the neighbour
list the LMDBs hold, :81-119), and the basis layers, embedding and residual blocks it
imports from PyG 1.7 (`torch_geometric.nn.models.dimenet`: Envelope, BesselBasisLayer,
SphericalBasisLayer, EmbeddingBlock, ResidualLayer; `torch_geometric.nn.inits.glorot_orthogonal`).
An independent implementation of the same function with the same parameter shapes and
initialisation: at the reference config (mlperf_hpc.yml:35-48, int_emb_size 64 and
basis_emb_size 8 from the wrapper's defaults :349-350) it has 1,810,182 parameters, the
reference's count (PyG's own DimeNetPlusPlus has 1,809,414: its output blocks' lin_up has
no bias, the reference's has, :178).

What the reference does that a reading of the DimeNet++ paper would get wrong, kept here:
  * the angles are computed from DETACHED positions (:423-434): forces flow through the
    distances only;
  * the graph is the one stored in the LMDB (otf_graph false, mlperf_hpc.yml:48), edges
    j -> i with the image offset of j (cell_offsets), at most 50 per centre atom;
  * the triplets k -> j -> i drop k == i only when k is the same periodic image as i
    (:323-326);
  * forces = -dE/dpos by autograd with create_graph=True (:458-472); the model predicts
    energy and forces in the normalised units (the trainer scales the targets).

Done differently, same function (docs/differences-from-reference.md):
  * scatter sums are index_add_ (torch_scatter.scatter), the triplets come from a sort of
    the edges by target (torch_sparse.SparseTensor rows), the radius graph is numpy/torch;
  * the spherical Bessel functions are evaluated by recursion in float64 and cast to the
    input's dtype; the reference lambdifies sympy's closed forms in float32, which lose
    digits to cancellation at small arguments (l = 6 near the shortest bonds). The zeros
    and normalisers are the reference's (float32 zeros, as dimenet_utils.Jn_zeros).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from hpckit.common.config import require
from hpckit.common.errors import KitError

N_ELEMENTS = 95   # the embedding's rows (EmbeddingBlock: Embedding(95, hidden))


# ----------------------------------------------------------------- bases (sympy-free)

def spherical_bessel(l_max: int, x: np.ndarray | torch.Tensor):
    """j_0 .. j_{l_max-1} at x (> 0) by upward recursion, stacked on a new last axis."""
    lib = torch if isinstance(x, torch.Tensor) else np
    s, c = lib.sin(x), lib.cos(x)
    out = [s / x]
    if l_max > 1:
        out.append(s / x ** 2 - c / x)
    for n in range(1, l_max - 1):
        out.append((2 * n + 1) / x * out[n] - out[n - 1])
    return lib.stack(out, -1) if lib is torch else np.stack(out, -1)


def _j(n: int, x: float) -> float:
    return float(spherical_bessel(n + 1, np.float64(x))[n])


def _brentq(f, a: float, b: float) -> float:
    """A root of f in [a, b] (f(a), f(b) of opposite signs) by bisection to float64."""
    fa = f(a)
    for _ in range(200):
        m = 0.5 * (a + b)
        fm = f(m)
        if fm == 0 or b - a < 1e-15 * max(1.0, abs(m)):
            return m
        if (fa < 0) == (fm < 0):
            a, fa = m, fm
        else:
            b = m
    return 0.5 * (a + b)


def bessel_zeros(n: int, k: int) -> np.ndarray:
    """The first k zeros of j_0 .. j_{n-1}, (n, k) float32, found as PyG's Jn_zeros finds
    them: the zeros of j_l lie between consecutive zeros of j_{l-1}, starting from j_0's
    at m * pi; kept as float32 like the reference."""
    zeros = np.zeros((n, k), dtype=np.float32)
    zeros[0] = np.arange(1, k + 1) * np.pi
    points = np.arange(1, k + n) * np.pi
    roots = np.zeros(k + n - 1, dtype=np.float32)
    for i in range(1, n):
        for j in range(k + n - 1 - i):
            roots[j] = _brentq(lambda x: _j(i, x), float(points[j]), float(points[j + 1]))
        points = roots.copy()
        zeros[i][:k] = roots[:k]
    return zeros


def legendre(l_max: int, z):
    """P_0 .. P_{l_max-1} at z (Bonnet's recursion), stacked on a new last axis."""
    out = [torch.ones_like(z)]
    if l_max > 1:
        out.append(z)
    for j in range(2, l_max):
        out.append(((2 * j - 1) * z * out[j - 1] - (j - 1) * out[j - 2]) / j)
    return torch.stack(out, -1)


class Envelope(nn.Module):
    """The smooth cutoff u(d) = 1/d + a d^(p-1) + b d^p + c d^(p+1), p = exponent + 1."""

    def __init__(self, exponent: int):
        super().__init__()
        self.p = exponent + 1
        self.a = -(self.p + 1) * (self.p + 2) / 2
        self.b = self.p * (self.p + 2)
        self.c = -self.p * (self.p + 1) / 2

    def forward(self, x):
        x0 = x.pow(self.p - 1)
        x1 = x0 * x
        return 1.0 / x + self.a * x0 + self.b * x1 + self.c * x1 * x


class BesselBasis(nn.Module):
    """Radial basis envelope(d / cutoff) * sin(freq_n d / cutoff), freq learnable (n pi)."""

    def __init__(self, num_radial: int, cutoff: float, envelope_exponent: int):
        super().__init__()
        self.cutoff = cutoff
        self.envelope = Envelope(envelope_exponent)
        self.freq = nn.Parameter(torch.empty(num_radial))
        self.reset_parameters()

    def reset_parameters(self):
        with torch.no_grad():
            torch.arange(1, self.freq.numel() + 1, out=self.freq).mul_(math.pi)

    def forward(self, dist):
        d = dist.unsqueeze(-1) / self.cutoff
        return self.envelope(d) * (self.freq * d).sin()


class SphericalBasis(nn.Module):
    """The 2D basis of a triplet: envelope(d) N_ln j_l(z_ln d) of the k->j distance times
    Y_l^0(angle), (num_spherical * num_radial) per triplet, index l * num_radial + n."""

    def __init__(self, num_spherical: int, num_radial: int, cutoff: float, envelope_exponent: int):
        super().__init__()
        if num_radial > 64:
            raise KitError("config key 'model.num_radial': at most 64 (the reference asserts it)")
        self.num_spherical, self.num_radial, self.cutoff = num_spherical, num_radial, cutoff
        self.envelope = Envelope(envelope_exponent)
        zeros = bessel_zeros(num_spherical, num_radial)
        norm = np.array([[1 / math.sqrt(0.5 * _j(l + 1, float(z)) ** 2) for z in zeros[l]]
                         for l in range(num_spherical)])
        self.register_buffer("zeros", torch.from_numpy(zeros.astype(np.float64)), persistent=False)
        self.register_buffer("norm", torch.from_numpy(norm), persistent=False)
        self.register_buffer("prefactor", torch.tensor(
            [math.sqrt((2 * l + 1) / (4 * math.pi)) for l in range(num_spherical)], dtype=torch.float64),
            persistent=False)

    def forward(self, dist, angle, idx_kj):
        d = dist / self.cutoff
        x = d.double().unsqueeze(-1).unsqueeze(-1) * self.zeros                 # (E, L, K)
        jl = spherical_bessel(self.num_spherical, x)                           # (E, L, K, L)
        ls = torch.arange(self.num_spherical, device=dist.device)
        rbf = jl[:, ls, :, ls].permute(1, 0, 2) * self.norm                   # (E, L, K): j_l(z_ln d)
        rbf = (self.envelope(d).unsqueeze(-1).unsqueeze(-1) * rbf.to(d.dtype))
        cbf = (legendre(self.num_spherical, angle.double().cos()) * self.prefactor).to(angle.dtype)
        n, k = self.num_spherical, self.num_radial
        return (rbf[idx_kj] * cbf.view(-1, n, 1)).view(-1, n * k)


def glorot_orthogonal(weight: torch.Tensor, scale: float) -> None:
    """PyG's init: an orthogonal matrix scaled to variance scale / (fan_in + fan_out)."""
    if weight.is_meta:   # shapes only (parameter counts, descriptions)
        return
    with torch.no_grad():
        nn.init.orthogonal_(weight)
        weight.mul_(torch.sqrt(scale / ((weight.size(-2) + weight.size(-1)) * weight.var())))


def swish(x):
    return x * torch.sigmoid(x)


def scatter_sum(src: torch.Tensor, index: torch.Tensor, size: int) -> torch.Tensor:
    return src.new_zeros((size, *src.shape[1:])).index_add_(0, index, src)


# ----------------------------------------------------------------- blocks

class EmbeddingBlock(nn.Module):
    def __init__(self, num_radial: int, hidden: int):
        super().__init__()
        self.emb = nn.Embedding(N_ELEMENTS, hidden)
        self.lin_rbf = nn.Linear(num_radial, hidden)
        self.lin = nn.Linear(3 * hidden, hidden)
        self.reset_parameters()

    def reset_parameters(self):
        with torch.no_grad():
            self.emb.weight.uniform_(-math.sqrt(3), math.sqrt(3))
        self.lin_rbf.reset_parameters()
        self.lin.reset_parameters()

    def forward(self, z, rbf, i, j):
        x = self.emb(z)
        rbf = swish(self.lin_rbf(rbf))
        return swish(self.lin(torch.cat([x[i], x[j], rbf], dim=-1)))


class ResidualLayer(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.lin1 = nn.Linear(hidden, hidden)
        self.lin2 = nn.Linear(hidden, hidden)
        self.reset_parameters()

    def reset_parameters(self):
        for lin in (self.lin1, self.lin2):
            glorot_orthogonal(lin.weight, 2.0)
            nn.init.zeros_(lin.bias)

    def forward(self, x):
        return x + swish(self.lin2(swish(self.lin1(x))))


class InteractionPPBlock(nn.Module):
    def __init__(self, hidden, int_emb, basis_emb, num_spherical, num_radial, before_skip, after_skip):
        super().__init__()
        self.lin_rbf1 = nn.Linear(num_radial, basis_emb, bias=False)
        self.lin_rbf2 = nn.Linear(basis_emb, hidden, bias=False)
        self.lin_sbf1 = nn.Linear(num_spherical * num_radial, basis_emb, bias=False)
        self.lin_sbf2 = nn.Linear(basis_emb, int_emb, bias=False)
        self.lin_kj = nn.Linear(hidden, hidden)
        self.lin_ji = nn.Linear(hidden, hidden)
        self.lin_down = nn.Linear(hidden, int_emb, bias=False)
        self.lin_up = nn.Linear(int_emb, hidden, bias=False)
        self.layers_before_skip = nn.ModuleList(ResidualLayer(hidden) for _ in range(before_skip))
        self.lin = nn.Linear(hidden, hidden)
        self.layers_after_skip = nn.ModuleList(ResidualLayer(hidden) for _ in range(after_skip))
        self.reset_parameters()

    def reset_parameters(self):
        for lin in (self.lin_rbf1, self.lin_rbf2, self.lin_sbf1, self.lin_sbf2, self.lin_kj, self.lin_ji,
                    self.lin_down, self.lin_up, self.lin):
            glorot_orthogonal(lin.weight, 2.0)
            if lin.bias is not None:
                nn.init.zeros_(lin.bias)
        for layer in (*self.layers_before_skip, *self.layers_after_skip):
            layer.reset_parameters()

    def forward(self, x, rbf, sbf, idx_kj, idx_ji):
        x_ji = swish(self.lin_ji(x))
        x_kj = swish(self.lin_kj(x))
        x_kj = x_kj * self.lin_rbf2(self.lin_rbf1(rbf))
        x_kj = swish(self.lin_down(x_kj))
        x_kj = x_kj[idx_kj] * self.lin_sbf2(self.lin_sbf1(sbf))
        x_kj = scatter_sum(x_kj, idx_ji, x.size(0))
        x_kj = swish(self.lin_up(x_kj))
        h = x_ji + x_kj
        for layer in self.layers_before_skip:
            h = layer(h)
        h = swish(self.lin(h)) + x
        for layer in self.layers_after_skip:
            h = layer(h)
        return h


class OutputPPBlock(nn.Module):
    def __init__(self, num_radial, hidden, out_emb, out_channels, num_layers):
        super().__init__()
        self.lin_rbf = nn.Linear(num_radial, hidden, bias=False)
        self.lin_up = nn.Linear(hidden, out_emb, bias=True)     # the reference's bias (:178)
        self.lins = nn.ModuleList(nn.Linear(out_emb, out_emb) for _ in range(num_layers))
        self.lin = nn.Linear(out_emb, out_channels, bias=False)
        self.reset_parameters()

    def reset_parameters(self):
        glorot_orthogonal(self.lin_rbf.weight, 2.0)
        glorot_orthogonal(self.lin_up.weight, 2.0)   # its bias keeps nn.Linear's default init, as upstream
        for lin in self.lins:
            glorot_orthogonal(lin.weight, 2.0)
            nn.init.zeros_(lin.bias)
        nn.init.zeros_(self.lin.weight)

    def forward(self, x, rbf, i, num_nodes):
        x = self.lin_rbf(rbf) * x
        x = scatter_sum(x, i, num_nodes)
        x = self.lin_up(x)
        for lin in self.lins:
            x = swish(lin(x))
        return self.lin(x)


# ----------------------------------------------------------------- graph

def triplets(edge_index: torch.Tensor, cell_offsets: torch.Tensor, num_nodes: int):
    """(idx_i, idx_j, idx_k, idx_kj, idx_ji) of every triplet k -> j -> i: for each edge
    ji (j -> i), every edge kj whose target is j, without k being the same image of i
    (dimenet_plus_plus.py:304-331; the SparseTensor rows are the edges sorted by target,
    then source)."""
    row, col = edge_index                                  # j -> i: row = source j, col = target i
    n_edges = row.numel()
    order = torch.argsort(col * num_nodes + row, stable=True)   # edges grouped by target
    per_target = torch.bincount(col, minlength=num_nodes)
    starts = torch.cumsum(per_target, 0) - per_target
    num = per_target[row]                                   # edges k -> j for each edge j -> i
    idx_ji = torch.repeat_interleave(torch.arange(n_edges, device=row.device), num)
    first = torch.cumsum(num, 0) - num
    within = torch.arange(idx_ji.numel(), device=row.device) - torch.repeat_interleave(first, num)
    idx_kj = order[torch.repeat_interleave(starts[row], num) + within]
    idx_i, idx_j, idx_k = col[idx_ji], row[idx_ji], row[idx_kj]
    keep = (idx_i != idx_k) | torch.any(cell_offsets[idx_kj] + cell_offsets[idx_ji] != 0, dim=-1)
    return idx_i[keep], idx_j[keep], idx_k[keep], idx_kj[keep], idx_ji[keep]


def pbc_offsets(cell: torch.Tensor, cell_offsets: torch.Tensor, neighbors: torch.Tensor) -> torch.Tensor:
    """Each edge's image offset in Angstrom: cell_offsets (E, 3) @ its graph's cell
    (get_pbc_distances: the cells repeated by the edges per graph)."""
    cells = torch.repeat_interleave(cell, neighbors, dim=0)
    return torch.bmm(cell_offsets.to(cell.dtype).view(-1, 1, 3), cells).view(-1, 3)


def image_range(cell: np.ndarray, radius: float) -> np.ndarray:
    """Images n along each lattice vector that can hold a neighbour within `radius` of an
    atom of the cell (atoms anywhere in the cell): ceil(radius / plane spacing) + 1."""
    volume = abs(np.linalg.det(cell))
    spacing = np.array([volume / np.linalg.norm(np.cross(cell[(a + 1) % 3], cell[(a + 2) % 3]))
                        for a in range(3)])
    return np.ceil(radius / spacing).astype(int) + 1


def radius_graph_pbc(pos: np.ndarray, cell: np.ndarray, radius: float, max_neighbors: int):
    """The neighbour list of one periodic structure as the reference's preprocessing stores
    it (atoms_to_graphs.py:81-119, preprocess_ef.py:87-95): every pair within `radius`,
    periodic in all three directions, self-images excluded (distance < 1e-8); per centre
    atom the `max_neighbors` nearest, sorted by distance; edges grouped by centre.
    Returns (edge_index int64 (2, E) rows [neighbour j, centre i], cell_offsets int64 (E, 3)
    the image of j, distances float64 (E,))."""
    pos = np.asarray(pos, np.float64)
    cell = np.asarray(cell, np.float64).reshape(3, 3)
    reach = image_range(cell, radius)
    grids = np.meshgrid(*(np.arange(-r, r + 1) for r in reach), indexing="ij")
    images = np.stack([g.ravel() for g in grids], -1)                     # (M, 3)
    shifts = images @ cell                                                # (M, 3)
    n = len(pos)
    centres, neighbours, offsets, dists = [], [], [], []
    for i in range(n):
        vec = pos[None, :, :] + shifts[:, None, :] - pos[i]               # (M, N, 3): j's images from i
        d = np.sqrt((vec ** 2).sum(-1))
        m_idx, j_idx = np.nonzero((d <= radius) & (d >= 1e-8))
        dd = d[m_idx, j_idx]
        order = np.argsort(dd, kind="stable")[:max_neighbors]
        centres.append(np.full(len(order), i))
        neighbours.append(j_idx[order])
        offsets.append(images[m_idx[order]])
        dists.append(dd[order])
    edge_index = np.stack([np.concatenate(neighbours), np.concatenate(centres)]).astype(np.int64)
    return edge_index, np.concatenate(offsets).astype(np.int64).reshape(-1, 3), np.concatenate(dists)


def radius_graph_pbc_batch(batch: dict, radius: float, max_neighbors: int) -> dict:
    """model.otf_graph: the batch's graph built on the fly (radius_graph_pbc per structure)
    instead of read from the records; the reference's option (mlperf_hpc.yml:48, off)."""
    pos, cell = batch["pos"].detach().cpu().numpy(), batch["cell"].detach().cpu().numpy()
    edges, offs, counts, start = [], [], [], 0
    for g, n in enumerate(batch["natoms"].tolist()):
        e, o, _ = radius_graph_pbc(pos[start:start + n], cell[g], radius, max_neighbors)
        edges.append(e + start)
        offs.append(o)
        counts.append(e.shape[1])
        start += n
    device = batch["pos"].device
    return {**batch, "edge_index": torch.from_numpy(np.concatenate(edges, 1)).to(device),
            "cell_offsets": torch.from_numpy(np.concatenate(offs)).to(device),
            "neighbors": torch.tensor(counts, dtype=torch.long, device=device)}


# ----------------------------------------------------------------- the network

class DimeNetPlusPlus(nn.Module):
    """DimeNetPlusPlusWrap(use_pbc=True, regress_forces=True) of the reference: a batch
    (hpckit.oc20.data.collate) -> (energy (B,), forces (N, 3))."""

    def __init__(self, cfg: dict):
        super().__init__()
        m = cfg["model"]
        self.cutoff, self.otf_graph = float(m["cutoff"]), bool(m["otf_graph"])
        self.max_neighbors = int(cfg["data"]["max_neighbors"])
        self.rbf = BesselBasis(m["num_radial"], self.cutoff, m["envelope_exponent"])
        self.sbf = SphericalBasis(m["num_spherical"], m["num_radial"], self.cutoff, m["envelope_exponent"])
        self.emb = EmbeddingBlock(m["num_radial"], m["hidden_channels"])
        self.output_blocks = nn.ModuleList(
            OutputPPBlock(m["num_radial"], m["hidden_channels"], m["out_emb_channels"], 1, m["num_output_layers"])
            for _ in range(m["num_blocks"] + 1))
        self.interaction_blocks = nn.ModuleList(
            InteractionPPBlock(m["hidden_channels"], m["int_emb_size"], m["basis_emb_size"], m["num_spherical"],
                               m["num_radial"], m["num_before_skip"], m["num_after_skip"])
            for _ in range(m["num_blocks"]))

    def energy(self, batch: dict, pos: torch.Tensor) -> torch.Tensor:
        if self.otf_graph:
            batch = radius_graph_pbc_batch(batch, self.cutoff, self.max_neighbors)
        edge_index, cell_offsets = batch["edge_index"], batch["cell_offsets"]
        offsets = pbc_offsets(batch["cell"], cell_offsets, batch["neighbors"])
        j, i = edge_index
        dist = (pos[j] - pos[i] + offsets).norm(dim=-1)
        nonzero = dist != 0                       # get_pbc_distances' "redundancy" filter
        if not bool(nonzero.all()):
            edge_index, cell_offsets, offsets, dist = (edge_index[:, nonzero], cell_offsets[nonzero],
                                                       offsets[nonzero], dist[nonzero])
            j, i = edge_index
        n_atoms = pos.size(0)
        idx_i, idx_j, idx_k, idx_kj, idx_ji = triplets(edge_index, cell_offsets, n_atoms)
        p = pos.detach()
        pos_ji = p[idx_j] - p[idx_i] + offsets[idx_ji]
        pos_kj = p[idx_k] - p[idx_j] + offsets[idx_kj]
        a = (pos_ji * pos_kj).sum(dim=-1)
        b = torch.linalg.cross(pos_ji, pos_kj).norm(dim=-1)
        angle = torch.atan2(b, a)
        rbf = self.rbf(dist)
        sbf = self.sbf(dist, angle, idx_kj)
        x = self.emb(batch["atomic_numbers"].long(), rbf, i, j)
        out = self.output_blocks[0](x, rbf, i, n_atoms)
        for interaction, output in zip(self.interaction_blocks, self.output_blocks[1:]):
            x = interaction(x, rbf, sbf, idx_kj, idx_ji)
            out = out + output(x, rbf, i, n_atoms)
        return scatter_sum(out, batch["batch"], batch["natoms"].numel()).view(-1)

    def forward(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.enable_grad():   # forces need the graph, in evaluation too (conditional_grad)
            pos = batch["pos"]
            if not pos.requires_grad:
                pos = pos.detach().requires_grad_(True)
            energy = self.energy(batch, pos)
            grad, = torch.autograd.grad(energy, pos, grad_outputs=torch.ones_like(energy),
                                        create_graph=self.training)
        return energy, -grad


# ----------------------------------------------------------------- config, description

MODEL_INT_KEYS = ("hidden_channels", "out_emb_channels", "num_blocks", "int_emb_size", "basis_emb_size",
                  "num_radial", "num_spherical", "num_output_layers", "envelope_exponent")


def validate_model_config(cfg: dict) -> None:
    m, d = cfg["model"], cfg["data"]
    for key in MODEL_INT_KEYS:
        require(isinstance(m[key], int) and not isinstance(m[key], bool) and m[key] >= 1, f"model.{key}",
                f"must be an integer >= 1 (got {m[key]!r})")
    for key in ("num_before_skip", "num_after_skip"):
        require(isinstance(m[key], int) and m[key] >= 0, f"model.{key}", f"must be an integer >= 0 (got {m[key]!r})")
    require(m["num_radial"] <= 64, "model.num_radial", "at most 64 (the reference's SphericalBasisLayer asserts it)")
    require(isinstance(m["cutoff"], (int, float)) and m["cutoff"] > 0, "model.cutoff", "must be a distance > 0")
    require(isinstance(m["otf_graph"], bool), "model.otf_graph", "must be true or false")
    require(isinstance(d["max_neighbors"], int) and d["max_neighbors"] >= 1, "data.max_neighbors",
            f"must be an integer >= 1 (got {d['max_neighbors']!r})")


def build_model(cfg: dict) -> DimeNetPlusPlus:
    validate_model_config(cfg)
    return DimeNetPlusPlus(cfg)


def parameter_count(cfg: dict) -> int:
    with torch.device("meta"):
        return sum(p.numel() for p in DimeNetPlusPlus(cfg).parameters())


def describe_rows(cfg: dict) -> list[tuple[str, str, int]]:
    """(module, what it is, parameters) for every block; together they hold every parameter."""
    m = cfg["model"]
    with torch.device("meta"):
        model = DimeNetPlusPlus(cfg)
    h, o = m["hidden_channels"], m["out_emb_channels"]
    rows = [("rbf", f"Bessel basis, {m['num_radial']} radial, cutoff {m['cutoff']} A", model.rbf),
            ("sbf", f"spherical basis {m['num_spherical']} x {m['num_radial']} (no parameters)", model.sbf),
            ("emb", f"embedding {N_ELEMENTS} elements -> {h}, edge message {3 * h} -> {h}", model.emb)]
    for b, block in enumerate(model.interaction_blocks):
        rows.append((f"interaction_blocks.{b}", f"interaction ++ {h}, triplets {m['int_emb_size']}, "
                     f"basis {m['basis_emb_size']}, skips {m['num_before_skip']}/{m['num_after_skip']}", block))
    for b, block in enumerate(model.output_blocks):
        rows.append((f"output_blocks.{b}", f"output {h} -> {o} x {m['num_output_layers']} -> 1 (energy per atom)",
                     block))
    return [(name, text, sum(p.numel() for p in mod.parameters())) for name, text, mod in rows]
