"""Synthetic DeepCAM samples written in the public dataset's on-disk format.

A sample is one snapshot of a global atmosphere on a regular latitude/longitude grid
(rows = latitude from -90 to 90 degrees, south to north; columns = longitude from 0 to 360
degrees, west to east), stored like the public CAM5 files:

    DIR/train/data-YYYY-MM-DD-HH-1.h5        climate/data      float32 (H, W, 16), channels last
    DIR/validation/data-YYYY-MM-DD-HH-2.h5   climate/labels_0  float32 (H, W), 0 / 1 / 2
                                             climate/labels_1  the same, relaxed (wider) masks
    DIR/stats.h5                             climate/{count, mean, sqmean, minval, maxval}
    DIR/manifest.json

Channels, in the order of the public files, with the units of CAM5:
TMQ (kg/m2), U850, V850, UBOT, VBOT (m/s), QREFHT (kg/kg), PS, PSL (Pa), T200, T500 (K),
PRECT (m/s), TS, TREFHT (K), Z1000, Z200, ZBOT (m).

Physics (simple, but every channel has a cause):

- a zonal-mean climate: surface temperature falling from 300 K at the equator to 245 K at
  the poles (minus 6.5 K/km over a per-seed orography), a cold tropical tropopause (T200),
  sea-level pressure with the equatorial trough, subtropical highs and subpolar lows, trade
  easterlies and mid-latitude westerlies;
- smooth random anomalies: a pressure anomaly (weak in the tropics, strongest in the storm
  tracks) with its geostrophic winds, temperature and moisture anomalies;
- derived fields kept consistent: QREFHT = relative humidity x saturation humidity at
  TREFHT, TMQ from QREFHT with a 2.5 km water-vapour scale height, PS from PSL and the
  orography, Z1000 / Z200 / ZBOT by the hypsometric equation;
- tropical cyclones (label 1) at 8-22 degrees latitude: a compact cyclonic vortex
  (counter-clockwise in the northern hemisphere, clockwise in the southern; with some
  inflow at the lowest level), a sea-level pressure minimum tied to the peak wind, a warm
  core at 500 and 200 hPa, a moisture and precipitation maximum; labelled within the radius;
- atmospheric rivers (label 2): long narrow filaments (quadratic Bezier curves from 20-32
  degrees to 42-60 degrees latitude, drifting eastward) of high TMQ with a low-level jet
  along the filament and enhanced precipitation; labelled within the (tapered) width.

Everything is deterministic in (seed, split, index): the events of a sample come from
`default_rng([seed, split_salt, index, 0])`, its fields from `default_rng([seed, split_salt,
index, 1])`, the orography from `default_rng([seed, OROGRAPHY_SALT])`. With
`shuffle_labels`, file i keeps the fields of sample i but carries the label maps of sample
perm[i] (a permutation without fixed points, recorded in the manifest): a sabotage that
checks of learning must catch.

stats.h5 is computed from the written training files as upstream's summarize_data.py does:
per file the mean, mean of squares, min and max over the pixels of every channel, merged with
equal weights; `count` is the number of files (a scalar), the vectors are float32.
"""

from __future__ import annotations

import datetime as _dt
import functools
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hpckit.common import memory
from hpckit.common.errors import KitError
from hpckit.common.pool import worker_pool
from hpckit.common.fileio import atomic_path, atomic_write_text, ensure_new_dir, sha256_file

GENERATOR_VERSION = 1
CHANNELS = ("TMQ", "U850", "V850", "UBOT", "VBOT", "QREFHT", "PS", "PSL", "T200", "T500",
            "PRECT", "TS", "TREFHT", "Z1000", "Z200", "ZBOT")
UNITS = {"TMQ": "kg/m2", "U850": "m/s", "V850": "m/s", "UBOT": "m/s", "VBOT": "m/s",
         "QREFHT": "kg/kg", "PS": "Pa", "PSL": "Pa", "T200": "K", "T500": "K", "PRECT": "m/s",
         "TS": "K", "TREFHT": "K", "Z1000": "m", "Z200": "m", "ZBOT": "m"}
CH = {name: i for i, name in enumerate(CHANNELS)}
CLASSES = ("background", "tropical_cyclone", "atmospheric_river")
SPLITS = ("train", "validation")
SPLIT_SALT = {"train": 0, "validation": 1}
RUN_NUMBER = {"train": 1, "validation": 2}     # the last field of the file name
OROGRAPHY_SALT = 2
SHUFFLE_SALT = 99
FULL_HEIGHT, FULL_WIDTH = 768, 1152
FIRST_DATE = _dt.datetime(2106, 1, 1, 0)
HOURS_PER_SAMPLE = 3                            # CAM5 output every 3 hours

# physical constants
R_EARTH = 6.371e6       # m
KM_PER_DEG = np.pi * R_EARTH / 180.0 / 1000.0
G = 9.81                # m/s2
R_DRY = 287.0           # J/(kg K)
OMEGA = 7.292e-5        # 1/s
RHO_850 = 1.1           # kg/m3, air density used for the geostrophic wind
VAPOUR_SCALE_M = 2500.0  # water-vapour scale height: TMQ ~ rho q H
SIGMA_BOT = 0.9925      # pressure of the lowest model level over the surface pressure

# event distributions (recorded in the manifest)
EVENTS = {
    "tropical_cyclone": {"count": [0, 4], "abs_lat_deg": [8.0, 22.0], "radius_km": [550.0, 900.0],
                         "vmax_m_s": [30.0, 70.0], "rmax_over_radius": 0.3,
                         "pressure_drop": "100 Pa * (vmax / 3.4)^(1/0.644)",
                         "warm_core_K": [2.0, 6.0], "tmq_bump_kg_m2": [15.0, 30.0],
                         "prect_bump_m_s": [1e-6, 5e-6], "relaxed_radius_factor": 1.25},
    "atmospheric_river": {"count": [1, 4], "start_abs_lat_deg": [20.0, 32.0],
                          "end_abs_lat_deg": [42.0, 60.0], "eastward_extent_deg": [40.0, 90.0],
                          "bend_deg": [-10.0, 10.0], "half_width_km": [650.0, 1000.0],
                          "taper": "half width * (0.35 + 0.65 sin(pi s))",
                          "tmq_bump_kg_m2": [15.0, 30.0], "jet_m_s": [15.0, 30.0],
                          "prect_bump_m_s": [2e-7, 1e-6], "relaxed_width_factor": 1.25},
}
RELAXED = 1.25


# ---------------------------------------------------------------- grid and smooth noise

@dataclass(frozen=True)
class Grid:
    height: int
    width: int

    @functools.cached_property
    def lat(self) -> np.ndarray:      # degrees, cell centres, south to north
        return -90.0 + (np.arange(self.height) + 0.5) * 180.0 / self.height

    @functools.cached_property
    def lon(self) -> np.ndarray:      # degrees, 0 .. 360
        return np.arange(self.width) * 360.0 / self.width


def lat_lon(height: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """Latitudes (rows) and longitudes (columns) of the grid, in degrees."""
    g = Grid(height, width)
    return g.lat.copy(), g.lon.copy()


def _wrap180(d):
    return (np.asarray(d) + 180.0) % 360.0 - 180.0


NOISE_TAPS = 7           # coarse nodes (per direction) that reach one grid cell


def _taps(dist: np.ndarray, corr_deg: float) -> tuple[np.ndarray, np.ndarray]:
    """Indices and weights of the NOISE_TAPS nearest nodes of every output point (Gaussian
    weights of width corr_deg, lowered to reach zero at 3 widths), scaled to unit sum of
    squares. Node spacing is at least 6/7 of corr_deg, so a node drops out of the nearest
    NOISE_TAPS only beyond 3 widths, where its weight is zero: the field stays continuous."""
    k = min(NOISE_TAPS, dist.shape[1])
    idx = np.argsort(np.abs(dist), axis=1, kind="stable")[:, :k]
    d = np.take_along_axis(dist, idx, axis=1)
    w = np.maximum(np.exp(-0.5 * (d / corr_deg) ** 2) - np.exp(-4.5), 0.0)   # zero from 3 widths on
    w /= np.sqrt((w ** 2).sum(axis=1, keepdims=True))
    return idx, w.astype(np.float32)


@functools.lru_cache(maxsize=16)
def _noise_taps(height: int, width: int, corr_deg: float):
    g = Grid(height, width)
    n_lat = int(np.ceil(180.0 / corr_deg)) + 1
    n_lon = max(3, int(np.ceil(360.0 / corr_deg)))
    node_lat = np.linspace(-90.0, 90.0, n_lat)
    node_lon = np.arange(n_lon) * 360.0 / n_lon
    iy, wy = _taps(g.lat[:, None] - node_lat[None, :], corr_deg)
    ix, wx = _taps(_wrap180(g.lon[:, None] - node_lon[None, :]), corr_deg)
    return iy, wy, ix, wx, (n_lat, n_lon)


def smooth_noise(rng: np.random.Generator, grid: Grid, corr_deg: float) -> np.ndarray:
    """A smooth unit-variance random field (H, W), correlated over about corr_deg degrees,
    periodic in longitude: Gaussian-weighted sums of unit normals on a coarse node grid.
    Elementwise float32 arithmetic only (no BLAS), so the result is the same bits on every
    machine and thread count."""
    iy, wy, ix, wx, shape = _noise_taps(grid.height, grid.width, float(corr_deg))
    nodes = rng.standard_normal(shape).astype(np.float32)
    rows = np.zeros((grid.height, shape[1]), np.float32)
    for k in range(iy.shape[1]):
        rows += wy[:, k, None] * nodes[iy[:, k], :]
    out = np.zeros((grid.height, grid.width), np.float32)
    for k in range(ix.shape[1]):
        out += wx[None, :, k] * rows[:, ix[:, k]]
    return out


@functools.lru_cache(maxsize=4)
def orography(seed: int, height: int, width: int) -> np.ndarray:
    """Surface height (m), fixed per seed: about a quarter of the globe is land."""
    rng = np.random.default_rng([seed, OROGRAPHY_SALT])
    n = smooth_noise(rng, Grid(height, width), 12.0)
    h = np.clip(2500.0 * (n - 0.65), 0.0, 5000.0).astype(np.float32)
    h.setflags(write=False)
    return h


def saturation_humidity(t_kelvin: np.ndarray, p_pa: np.ndarray) -> np.ndarray:
    """Saturation specific humidity (kg/kg), Tetens' formula over water."""
    es = 610.78 * np.exp(17.27 * (t_kelvin - 273.15) / (t_kelvin - 35.86))
    return 0.622 * es / np.maximum(p_pa - 0.378 * es, 1.0)


# ---------------------------------------------------------------- events

def draw_events(rng: np.random.Generator) -> dict:
    """Tropical cyclones and atmospheric rivers of one sample (plain floats, JSON-ready)."""
    tc_spec, ar_spec = EVENTS["tropical_cyclone"], EVENTS["atmospheric_river"]
    tcs = []
    for _ in range(int(rng.integers(tc_spec["count"][0], tc_spec["count"][1] + 1))):
        hemi = float(rng.choice([-1.0, 1.0]))
        vmax = float(rng.uniform(*tc_spec["vmax_m_s"]))
        tcs.append({
            "lat": hemi * float(rng.uniform(*tc_spec["abs_lat_deg"])),
            "lon": float(rng.uniform(0.0, 360.0)),
            "radius_km": float(rng.uniform(*tc_spec["radius_km"])),
            "vmax_m_s": vmax,
            "pressure_drop_pa": float(100.0 * (vmax / 3.4) ** (1 / 0.644)),
            "warm_core_k": float(rng.uniform(*tc_spec["warm_core_K"])),
            "tmq_bump": float(rng.uniform(*tc_spec["tmq_bump_kg_m2"])),
            "prect_bump": float(rng.uniform(*tc_spec["prect_bump_m_s"])),
        })
    ars = []
    for _ in range(int(rng.integers(ar_spec["count"][0], ar_spec["count"][1] + 1))):
        hemi = float(rng.choice([-1.0, 1.0]))
        lat0 = hemi * float(rng.uniform(*ar_spec["start_abs_lat_deg"]))
        lon0 = float(rng.uniform(0.0, 360.0))
        lat1 = hemi * float(rng.uniform(*ar_spec["end_abs_lat_deg"]))
        lon1 = lon0 + float(rng.uniform(*ar_spec["eastward_extent_deg"]))
        bend = float(rng.uniform(*ar_spec["bend_deg"]))
        ars.append({
            "start": [lat0, lon0 % 360.0], "end": [lat1, lon1 % 360.0], "extent_deg": lon1 - lon0,
            "bend_deg": bend,
            "half_width_km": float(rng.uniform(*ar_spec["half_width_km"])),
            "tmq_bump": float(rng.uniform(*ar_spec["tmq_bump_kg_m2"])),
            "jet_m_s": float(rng.uniform(*ar_spec["jet_m_s"])),
            "prect_bump": float(rng.uniform(*ar_spec["prect_bump_m_s"])),
        })
    return {"tropical_cyclones": tcs, "atmospheric_rivers": ars}


def _window(grid: Grid, lat_c: float, lon_c: float, half_lat: float, half_lon: float):
    """Rows (slice) and columns (index array, wrapping in longitude) of a box around a point,
    with the latitudes and the wrapped longitude offsets (degrees) of its cells."""
    r0 = int(np.searchsorted(grid.lat, lat_c - half_lat))
    r1 = int(np.searchsorted(grid.lat, lat_c + half_lat, side="right"))
    dlon_all = _wrap180(grid.lon - lon_c)
    cols = np.nonzero(np.abs(dlon_all) <= min(half_lon, 179.9))[0]
    return slice(r0, r1), cols, grid.lat[r0:r1], dlon_all[cols]


def _ar_path(ar: dict, n: int = 33) -> tuple[np.ndarray, np.ndarray]:
    """Points (lat, lon offset from the start, degrees) along the river's centre line."""
    (lat0, _), (lat1, _) = ar["start"], ar["end"]
    p0, p2 = np.array([lat0, 0.0]), np.array([lat1, ar["extent_deg"]])
    mid = 0.5 * (p0 + p2)
    d = p2 - p0
    normal = np.array([-d[1], d[0]]) / np.linalg.norm(d)
    p1 = mid + 2.0 * ar["bend_deg"] * normal   # the curve's midpoint is offset by bend_deg
    s = np.linspace(0.0, 1.0, n)[:, None]
    pts = (1 - s) ** 2 * p0 + 2 * (1 - s) * s * p1 + s ** 2 * p2
    return pts[:, 0], pts[:, 1]


def _ar_geometry(grid: Grid, ar: dict, reach: float):
    """Distance (km) of the cells near the river to its centre line, the local half width,
    and the unit vector (east, north) along the line at the nearest point.
    `reach` = how many half widths around the line to cover."""
    plat, plon = _ar_path(ar)
    lon0 = ar["start"][1]
    w0 = ar["half_width_km"]
    margin = reach * w0 / KM_PER_DEG
    lat_lo, lat_hi = plat.min() - margin, plat.max() + margin
    lat_c = 0.5 * (lat_lo + lat_hi)
    lon_mid = 0.5 * (plon.min() + plon.max())
    half_lon = 0.5 * (plon.max() - plon.min()) + margin / np.cos(np.radians(min(80.0, max(abs(lat_lo), abs(lat_hi)))))
    rows, cols, lat, dlon = _window(grid, lat_c, lon0 + lon_mid, 0.5 * (lat_hi - lat_lo), half_lon)
    if lat.size == 0 or cols.size == 0:
        return rows, cols, None
    dlon = dlon + lon_mid                                        # offsets from the start
    # sinusoidal projection around the start meridian, km
    f4 = np.float32
    px = (plon * np.cos(np.radians(plat)) * KM_PER_DEG).astype(f4)[None, None, :]
    py = (plat * KM_PER_DEG).astype(f4)[None, None, :]
    x = (dlon[None, :] * np.cos(np.radians(lat))[:, None] * KM_PER_DEG).astype(f4)[:, :, None]
    y = (lat * KM_PER_DEG).astype(f4)[:, None, None]
    ax, ay = px[..., :-1], py[..., :-1]
    bx, by = px[..., 1:] - ax, py[..., 1:] - ay
    seg2 = bx ** 2 + by ** 2
    t = np.clip(((x - ax) * bx + (y - ay) * by) / seg2, 0.0, 1.0)
    d2 = (x - ax - t * bx) ** 2 + (y - ay - t * by) ** 2
    k = np.argmin(d2, axis=-1)
    dist = np.sqrt(np.take_along_axis(d2, k[..., None], -1)[..., 0])
    n_seg = bx.shape[-1]
    s = (k + np.take_along_axis(t, k[..., None], -1)[..., 0]) / n_seg
    half_width = w0 * (0.35 + 0.65 * np.sin(np.pi * s))
    seg_len = np.sqrt(seg2[0, 0])
    tx, ty = (bx[0, 0] / seg_len)[k], (by[0, 0] / seg_len)[k]
    return rows, cols, (dist, half_width, tx, ty)


def _tc_geometry(grid: Grid, tc: dict, reach: float):
    """Offsets east / north (km) and distance of the cells within reach * radius of a cyclone."""
    half_lat = reach * tc["radius_km"] / KM_PER_DEG
    half_lon = half_lat / np.cos(np.radians(min(80.0, abs(tc["lat"]) + half_lat)))
    rows, cols, lat, dlon = _window(grid, tc["lat"], tc["lon"], half_lat, half_lon)
    dx = dlon[None, :] * np.cos(np.radians(lat))[:, None] * KM_PER_DEG
    dy = np.broadcast_to(((lat - tc["lat"]) * KM_PER_DEG)[:, None], dx.shape)
    return rows, cols, dx, dy, np.hypot(dx, dy)


TC_REACH, AR_REACH = 4.0, 2.5     # how far (radii, half widths) an event changes the fields


def event_geometry(events: dict, grid: Grid) -> dict:
    """The windows and distances of every event, computed once for fields and labels."""
    return {"tropical_cyclones": [_tc_geometry(grid, tc, TC_REACH) for tc in events["tropical_cyclones"]],
            "atmospheric_rivers": [_ar_geometry(grid, ar, AR_REACH) for ar in events["atmospheric_rivers"]]}


def label_maps(events: dict, grid: Grid, geometry: dict | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(labels_0, labels_1) float32 (H, W): 0 background, 1 cyclone, 2 river; labels_1 has
    masks RELAXED times wider. Cyclones are drawn over rivers."""
    geometry = geometry or event_geometry(events, grid)
    out = []
    for factor in (1.0, RELAXED):
        lab = np.zeros((grid.height, grid.width), dtype=np.float32)
        for rows, cols, geo in geometry["atmospheric_rivers"]:
            if geo is not None:
                dist, half_width = geo[0], geo[1]
                sub = lab[rows, cols]
                sub[dist < factor * half_width] = 2.0
                lab[rows, cols] = sub
        for tc, (rows, cols, _, _, r) in zip(events["tropical_cyclones"], geometry["tropical_cyclones"]):
            sub = lab[rows, cols]
            sub[r < factor * tc["radius_km"]] = 1.0
            if not (r < factor * tc["radius_km"]).any() and r.size:      # smaller than a cell
                sub[np.unravel_index(np.argmin(r), r.shape)] = 1.0
            lab[rows, cols] = sub
        out.append(lab)
    return out[0], out[1]


# ---------------------------------------------------------------- fields

def sample_fields(events: dict, grid: Grid, rng: np.random.Generator, seed: int,
                  geometry: dict | None = None) -> np.ndarray:
    """The 16 channels (H, W, 16) float32 of one sample with the given events."""
    geometry = geometry or event_geometry(events, grid)
    lat = grid.lat.astype(np.float32)[:, None]
    phi = np.radians(lat)
    s2 = np.sin(phi) ** 2
    c2 = np.cos(phi) ** 2
    H, W = grid.height, grid.width
    oro = orography(seed, H, W)

    # random anomalies (the order of draws is fixed)
    n_p = smooth_noise(rng, grid, 18.0)       # pressure
    n_t = smooth_noise(rng, grid, 22.0)       # temperature
    n_q = smooth_noise(rng, grid, 12.0)       # relative humidity
    n_v = smooth_noise(rng, grid, 6.0)        # small-scale moisture
    n_r = smooth_noise(rng, grid, 5.0)        # precipitation
    n_u = smooth_noise(rng, grid, 8.0)        # small-scale wind

    # temperature (K)
    t_anom = (1.5 + 3.0 * s2) * n_t
    ts_sea = 245.0 + 55.0 * c2 + t_anom
    ts = ts_sea - 0.0065 * oro
    trefht = ts - 1.0 - 0.3 * n_u
    t500 = 232.0 + 30.0 * c2 + 0.8 * t_anom
    t200 = 221.0 - 6.0 * c2 + 0.3 * t_anom

    # sea-level pressure (Pa): equatorial trough, subtropical highs, subpolar lows, storm tracks
    p_amp = 150.0 + 1800.0 * np.exp(-((np.abs(lat) - 55.0) / 15.0) ** 2)
    p_anom = p_amp * n_p
    psl = 101300.0 - 400.0 * np.cos(6.0 * phi) + p_anom

    # winds (m/s): zonal-mean trades and westerlies + geostrophic wind of the anomaly
    u_zonal = 14.0 * np.exp(-((np.abs(lat) - 45.0) / 14.0) ** 2) - 7.0 * np.exp(-(lat / 15.0) ** 2)
    dy = np.radians(180.0 / H) * R_EARTH
    dx = np.maximum(np.cos(phi), 1e-3) * np.radians(360.0 / W) * R_EARTH
    dpdy = np.gradient(p_anom, dy, axis=0)
    dpdx = (np.roll(p_anom, -1, axis=1) - np.roll(p_anom, 1, axis=1)) / (2.0 * dx)
    f = 2.0 * OMEGA * np.sign(lat) * np.maximum(np.abs(np.sin(phi)), np.sin(np.radians(15.0)))
    taper = np.clip(np.abs(lat) / 15.0, 0.0, 1.0) * np.clip(np.cos(phi) / np.cos(np.radians(70.0)), 0.0, 1.0)
    u_g = -dpdy / (RHO_850 * f) * taper
    v_g = dpdx / (RHO_850 * f) * taper
    u850 = u_zonal + u_g + 2.0 * n_u
    v850 = v_g + 2.0 * np.roll(n_u, W // 7, axis=1)
    # surface wind: weaker, turned towards low pressure (by about 20 degrees)
    turn = np.radians(20.0) * np.sign(lat)
    ubot = 0.7 * (u850 * np.cos(turn) - v850 * np.sin(turn))
    vbot = 0.7 * (u850 * np.sin(turn) + v850 * np.cos(turn))

    # humidity and moisture
    rel_hum = np.clip(0.75 + 0.1 * n_q, 0.3, 0.98)
    tmq_factor = 1.0 + 0.2 * n_v
    prect_factor = np.exp(1.2 * n_r - 0.7)
    tmq_add = np.zeros((H, W), np.float32)
    prect_add = np.zeros((H, W), np.float32)

    for tc, (rows, cols, ex, ny, r) in zip(events["tropical_cyclones"], geometry["tropical_cyclones"]):
        if r.size == 0:
            continue
        hemi = 1.0 if tc["lat"] >= 0 else -1.0
        radius = tc["radius_km"]
        rmax = EVENTS["tropical_cyclone"]["rmax_over_radius"] * radius
        x = r / rmax
        speed = tc["vmax_m_s"] * 2.0 * x / (1.0 + x ** 2) * np.exp(-(r / (2.0 * radius)) ** 2)
        rr = np.maximum(r, 1e-3)
        # counter-clockwise (east, north) unit vector is (-dy, dx)/r; clockwise in the south
        ut, vt = -hemi * ny / rr * speed, hemi * ex / rr * speed
        inflow = 0.35 * speed
        ur, vr = -ex / rr * inflow, -ny / rr * inflow
        env = np.exp(-(r / (3.0 * radius)) ** 2)    # fade the pressure drop far out
        dp = tc["pressure_drop_pa"] / np.sqrt(1.0 + x ** 2) * env
        core = np.exp(-(r / (0.5 * radius)) ** 2)
        wet = np.exp(-(r / (0.6 * radius)) ** 2)
        rain = np.exp(-(r / (0.35 * radius)) ** 2)
        for arr, val in ((u850, ut + 0.3 * ur), (v850, vt + 0.3 * vr),
                         (ubot, 0.8 * (ut + ur)), (vbot, 0.8 * (vt + vr)),
                         (psl, -dp), (t500, tc["warm_core_k"] * core),
                         (t200, 1.5 * tc["warm_core_k"] * core), (rel_hum, 0.15 * wet),
                         (tmq_add, tc["tmq_bump"] * wet), (prect_add, tc["prect_bump"] * rain)):
            arr[rows, cols] += val.astype(np.float32)

    for ar, (rows, cols, geo) in zip(events["atmospheric_rivers"], geometry["atmospheric_rivers"]):
        if geo is None:
            continue
        dist, half_width, tx, ty = geo
        q = np.exp(-0.7 * (dist / half_width) ** 2)
        jet = ar["jet_m_s"] * np.exp(-(dist / half_width) ** 2)
        for arr, val in ((u850, jet * tx), (v850, jet * ty), (ubot, 0.7 * jet * tx),
                         (vbot, 0.7 * jet * ty), (rel_hum, 0.1 * q), (tmq_add, ar["tmq_bump"] * q),
                         (prect_add, ar["prect_bump"] * q ** 2)):
            arr[rows, cols] += val.astype(np.float32)

    # derived fields
    ps = psl * np.exp(-G * oro / (R_DRY * (ts_sea - 0.00325 * oro)))
    rel_hum = np.clip(rel_hum, 0.05, 1.0)
    qrefht = rel_hum * saturation_humidity(trefht, ps)
    tmq = np.clip(1.2 * VAPOUR_SCALE_M * qrefht * tmq_factor + tmq_add, 0.05, 110.0)
    prect = 8e-8 * (tmq / 40.0) ** 3 * prect_factor + prect_add
    z1000 = R_DRY * ts_sea / G * np.log(psl / 1.0e5)
    t_layer = (ts_sea + t500 + t200) / 3.0
    z200 = z1000 + R_DRY * t_layer / G * np.log(1000.0 / 200.0)
    zbot = R_DRY * trefht / G * np.log(1.0 / SIGMA_BOT)
    clip_wind = lambda a: np.clip(a, -85.0, 85.0)

    chans = {"TMQ": tmq, "U850": clip_wind(u850), "V850": clip_wind(v850), "UBOT": clip_wind(ubot),
             "VBOT": clip_wind(vbot), "QREFHT": qrefht, "PS": ps, "PSL": psl, "T200": t200, "T500": t500,
             "PRECT": prect, "TS": ts, "TREFHT": trefht, "Z1000": z1000, "Z200": z200, "ZBOT": zbot}
    out = np.empty((H, W, len(CHANNELS)), dtype=np.float32)
    for name, arr in chans.items():
        out[..., CH[name]] = np.broadcast_to(arr, (H, W))
    return out


def sample_events(seed: int, split: str, index: int) -> dict:
    return draw_events(np.random.default_rng([seed, SPLIT_SALT[split], index, 0]))


def make_sample(seed: int, split: str, index: int, height: int = FULL_HEIGHT, width: int = FULL_WIDTH,
                labels_from: int | None = None):
    """(data (H, W, 16) float32, labels_0, labels_1, events) of one sample; the label maps
    are those of sample `labels_from` (default: its own)."""
    grid = Grid(height, width)
    events = sample_events(seed, split, index)
    geometry = event_geometry(events, grid)
    x = sample_fields(events, grid, np.random.default_rng([seed, SPLIT_SALT[split], index, 1]), seed, geometry)
    if labels_from in (None, index):
        l0, l1 = label_maps(events, grid, geometry)
    else:
        l0, l1 = label_maps(sample_events(seed, split, labels_from), grid)
    return x, l0, l1, events


# ---------------------------------------------------------------- files

def sample_name(split: str, index: int) -> str:
    """Public names look like data-YYYY-MM-DD-HH-R.h5 (R the simulation run); here a
    synthetic 3-hourly date from 2106-01-01 and run 1 (train) or 2 (validation)."""
    t = FIRST_DATE + _dt.timedelta(hours=HOURS_PER_SAMPLE * index)
    return f"data-{t:%Y-%m-%d-%H}-{RUN_NUMBER[split]}.h5"


def write_h5_atomic(path: Path, datasets: dict) -> str:
    """Write {name: array} to an HDF5 file atomically; returns the sha256 of the file."""
    import h5py

    with atomic_path(path) as tmp, h5py.File(tmp, "w") as f:
        for name, arr in datasets.items():
            f.create_dataset(name, data=arr)
    return sha256_file(path)


@dataclass(frozen=True)
class SampleJob:
    split: str
    index: int
    labels_from: int
    height: int
    width: int
    seed: int
    directory: str


def _write_sample(job: SampleJob) -> dict:
    x, l0, l1, events = make_sample(job.seed, job.split, job.index, job.height, job.width, job.labels_from)
    name = sample_name(job.split, job.index)
    digest = write_h5_atomic(Path(job.directory) / name,
                             {"climate/data": x, "climate/labels_0": l0, "climate/labels_1": l1})
    pixels = np.bincount(l0.astype(np.int64).ravel(), minlength=3)
    return {"name": name, "sha256": digest, "labels_from": job.labels_from, "events": events,
            "class_pixels": [int(v) for v in pixels[:3]]}


def file_stats(path: str | os.PathLike) -> tuple[np.ndarray, ...]:
    """Per-channel (mean, mean of squares, min, max) of one file's climate/data, float64."""
    import h5py

    with h5py.File(path, "r") as f:
        arr = f["climate/data"][...]
    flat = arr.reshape(-1, arr.shape[-1])
    return (flat.mean(axis=0, dtype=np.float64), np.square(flat, dtype=np.float64).mean(axis=0),
            flat.min(axis=0).astype(np.float64), flat.max(axis=0).astype(np.float64))


def merge_stats(per_file: list[tuple[np.ndarray, ...]]) -> dict:
    """Upstream's merge: equal-weight average of means and mean squares, elementwise
    min / max; count = number of files."""
    n = len(per_file)
    return {"count": np.int64(n),
            "mean": (sum(t[0] for t in per_file) / n).astype(np.float32),
            "sqmean": (sum(t[1] for t in per_file) / n).astype(np.float32),
            "minval": np.min([t[2] for t in per_file], axis=0).astype(np.float32),
            "maxval": np.max([t[3] for t in per_file], axis=0).astype(np.float32)}


def derangement(n: int, rng: np.random.Generator) -> np.ndarray:
    """A random permutation without fixed points (the identity for n == 1)."""
    if n < 2:
        return np.arange(n)
    while True:
        perm = rng.permutation(n)
        if not np.any(perm == np.arange(n)):
            return perm


BYTES_PER_PIXEL = 1024   # the generator's working set per grid cell (16 channels, float64 fields), rounded up


def write_dataset(out: str | os.PathLike, n_train: int, n_valid: int, height: int = FULL_HEIGHT,
                  width: int = FULL_WIDTH, seed: int = 0, workers: int | None = None,
                  shuffle_labels: bool = False) -> dict:
    """Write DIR/train, DIR/validation, DIR/stats.h5 and DIR/manifest.json; returns the manifest."""
    if n_train < 1 or n_valid < 1:
        raise KitError(f"datagen: --train and --valid must be >= 1 (got {n_train}, {n_valid})")
    if height < 8 or width < 8:
        raise KitError(f"datagen: --height and --width must be >= 8 (got {height} x {width})")
    if shuffle_labels and min(n_train, n_valid) < 2:
        raise KitError("datagen: shuffled labels need at least 2 samples per split")
    workers = workers or os.cpu_count() or 1
    memory.require(workers * height * width * BYTES_PER_PIXEL,
                   f"datagen: --height {height} --width {width} with {workers} workers")
    root = Path(out)
    ensure_new_dir(root, "datagen --out", "hpckit datagen writes")
    counts = {"train": n_train, "validation": n_valid}
    jobs = {}
    for split in SPLITS:
        d = root / split
        d.mkdir(parents=True, exist_ok=True)
        n = counts[split]
        perm = (derangement(n, np.random.default_rng([seed, SPLIT_SALT[split], SHUFFLE_SALT]))
                if shuffle_labels else np.arange(n))
        jobs[split] = [SampleJob(split, i, int(perm[i]), height, width, seed, str(d)) for i in range(n)]
    with worker_pool(workers) as pool:
        mapper = (lambda fn, items: list(pool.map(fn, items, chunksize=1))) if pool else \
                 (lambda fn, items: [fn(i) for i in items])
        samples = {split: mapper(_write_sample, jobs[split]) for split in SPLITS}
        train_paths = [str(root / "train" / s["name"]) for s in samples["train"]]
        stats = merge_stats(mapper(file_stats, train_paths))
    stats_digest = write_h5_atomic(root / "stats.h5", {f"climate/{k}": v for k, v in stats.items()})
    pixels = np.sum([s["class_pixels"] for sp in SPLITS for s in samples[sp]], axis=0)
    manifest = {
        "benchmark": "deepcam",
        "generator": "hpckit.deepcam.synthetic",
        "generator_version": GENERATOR_VERSION,
        "format": "hdf5",
        "seed": seed,
        "shuffled_labels": shuffle_labels,
        "counts": counts,
        "sample_shape": [height, width, len(CHANNELS)],
        "sample_dtype": "float32",
        "label_dtype": "float32",
        "datasets": {"data": "climate/data", "labels": "climate/labels_0",
                     "relaxed_labels": "climate/labels_1"},
        "channels": list(CHANNELS),
        "units": UNITS,
        "classes": list(CLASSES),
        "class_fractions": [float(v) for v in pixels / pixels.sum()],
        "grid": {"rows": "latitude, south to north, cell centres -90 + (i + 0.5) * 180 / H",
                 "columns": "longitude, east from 0, j * 360 / W"},
        "parameters": {"events": EVENTS, "orography_salt": OROGRAPHY_SALT,
                       "rng": "default_rng([seed, split_salt, index, 0]) events, "
                              "[..., 1] fields", "split_salt": SPLIT_SALT},
        "stats": {"file": "stats.h5", "sha256": stats_digest, "count": int(stats["count"]),
                  "computed_from": "train", "dtype": "float32",
                  "minval": stats["minval"].tolist(), "maxval": stats["maxval"].tolist()},
        "samples": samples,
    }
    atomic_write_text(root / "manifest.json", json.dumps(manifest, indent=1) + "\n")
    return manifest
