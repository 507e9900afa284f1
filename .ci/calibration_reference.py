"""Reference calibrations for refactors: run before and after a change of the calibration
code; the answers must be equal to the bit.

Six calibrations of fixed worlds and seeds (two-ray with every group including the
polarization and a position prior; a room's surfaces from two starts with mounted APs;
unlabeled snapshots; complex receivers with gains, constants and positions;
``calibrate_many`` of two deployments) write every value, standard error, log-likelihood,
CPO, unlabeled position and receiver to one ``.npz``; ``--compare`` counts the arrays that
differ from an earlier run's.

    python .ci/calibration_reference.py --out before.npz       # at the old commit
    python .ci/calibration_reference.py --out after.npz --compare before.npz
"""

import argparse
import sys

import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)
import dmimo_jax as dj  # noqa: E402
from dmimo_jax.calibration import (  # noqa: E402
    Positions,
    Surfaces,
    Unlabeled,
    calibrate,
    calibrate_many,
)
from dmimo_jax.receivers import ReceiverModel, Receivers  # noqa: E402

SCENE = dj.paper_scene(-10.0, convention="itu")
M = SCENE.num_aps
L = 30
RNG = np.random.default_rng(11)
OFF = RNG.uniform(-np.pi, np.pi, M)
X = np.asarray(dj.sample_positions(jax.random.key(0), L, SCENE))
CPO = np.asarray(dj.random_cpos(jax.random.key(1), L))
out = {}


def put(tag, cal):
    for k, v in cal.values.items():
        out[f"{tag}/v/{k}"] = np.asarray(v)
        out[f"{tag}/s/{k}"] = np.asarray(cal.stderr[k])
    out[f"{tag}/ll"] = np.asarray(cal.log_likelihood)
    out[f"{tag}/chi2"] = np.asarray(cal.reduced_chi2)
    out[f"{tag}/cpo"] = np.asarray(cal.cpo)
    out[f"{tag}/llp"] = np.asarray(cal.log_likelihood_by_polarization)
    out[f"{tag}/pol"] = np.asarray(cal.polarization == "TM")
    print(tag, cal.status, float(cal.reduced_chi2), cal.fit, cal.surfaces)


# 1 two-ray every group, noisy
ap = np.asarray(SCENE.ap_positions) + RNG.normal(0, 1e-2, (M, 3))
truth = dj.TwoRayModel(
    SCENE.replace(
        ap_positions=ap, ap_phase_offsets=OFF, antenna=dj.CosinePattern(1.7), polarization="TM"
    )
)
nominal = dj.TwoRayModel(SCENE.replace(eps_r=4.0 - 0.5j, antenna=dj.CosinePattern(1.0)))
var = jax.vmap(truth.variance)(X)
r = dj.simulate_phases_batch(jax.random.key(2), truth, jnp.asarray(X), jnp.asarray(CPO))
put(
    "tworay",
    calibrate(
        nominal,
        X,
        r,
        var,
        fit=(Positions(prior=0.02), "ap_phase_offsets", "surfaces", "antenna", "polarization"),
        num_steps=40,
        warn=False,
    ),
)
# 2 room: surfaces by name + positions (mounted) + offsets, unlabeled
ap2 = np.asarray(SCENE.ap_positions).copy()
ap2[:, :2] += RNG.normal(0, 5e-3, (M, 2))
walls = {"x0": "brick", "x1": "wood", "y0": "glass", "y1": "concrete"}
rt = dj.room_model(
    SCENE.replace(ap_positions=ap2, ap_phase_offsets=OFF),
    ceiling="plasterboard",
    walls=walls,
    floor="concrete",
)
rn = dj.room_model(SCENE, ceiling=3.0 - 0.1j, walls=3.0 - 0.1j, floor=3.0 - 0.1j)
var2 = jax.vmap(rt.variance)(X)
r2 = dj.simulate_phases_batch(jax.random.key(3), rt, jnp.asarray(X), jnp.asarray(CPO))
put(
    "room",
    calibrate(
        rn,
        X,
        r2,
        var2,
        fit=("ap_positions", "ap_phase_offsets", Surfaces(starts=("concrete", 3.0 - 0.2j))),
        warn=False,
    ),
)
xu = np.asarray(dj.sample_positions(jax.random.key(5), 8, SCENE))
ru = dj.simulate_phases_batch(jax.random.key(6), truth, jnp.asarray(xu), jnp.zeros(8))
cal = calibrate(
    nominal,
    X[:20],
    r[:20],
    var[:20],
    fit=("ap_positions", "ap_phase_offsets"),
    unlabeled=Unlabeled(ru, jax.vmap(truth.variance)(xu), xu + 0.01),
    warn=False,
)
put("unl", cal)
out["unl/x"] = np.asarray(cal.unlabeled_x)
# 3 complex receivers
g = np.exp(1j * OFF) * (1 + 0.1 * RNG.normal(size=M))
g = g / g[0]
b = 0.005 * (RNG.normal(size=M) + 1j * RNG.normal(size=M))
tr = dj.TwoRayModel(SCENE.replace(ap_positions=ap))
h = (
    jax.vmap(lambda x: ReceiverModel(tr, Receivers(g, b)).channel(x))(jnp.asarray(X))
    * np.exp(1j * CPO)[:, None]
)
sig = 1e-4
h = h + sig * (RNG.normal(size=h.shape) + 1j * RNG.normal(size=h.shape)) / np.sqrt(2)
cal = calibrate(
    dj.TwoRayModel(SCENE),
    X,
    np.asarray(h),
    np.full((L, M), sig**2),
    fit=("receiver_gains", "receiver_constants", Positions(prior=0.05)),
    warn=False,
)
put("rx", cal)
out["rx/g"] = np.asarray(cal.receivers.gains)
out["rx/b"] = np.asarray(cal.receivers.constants)
# 4 many
xs = np.stack([X, X[::-1]])
rs = np.stack([np.asarray(r), np.asarray(r)[::-1]])
vs = np.stack([np.asarray(var)] * 2)
for i, c in enumerate(
    calibrate_many(
        nominal, xs, rs, vs, fit=("ap_positions", "ap_phase_offsets", "surfaces"), warn=False
    )
):
    put(f"many{i}", c)
parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--out", required=True, help="the .npz to write")
parser.add_argument("--compare", help="an earlier run's .npz: count the arrays that differ")
args = parser.parse_args()
np.savez(args.out, **out)
if args.compare:
    ref = np.load(args.compare)
    if sorted(ref.files) != sorted(out):
        sys.exit(f"the runs hold different arrays: {sorted(set(ref.files) ^ set(out))}")
    differ = [
        k for k in out if not np.array_equal(ref[k], out[k], equal_nan=ref[k].dtype.kind in "fc")
    ]
    print(f"{len(out)} arrays, {len(differ)} differ" + (f": {differ}" if differ else ""))
    sys.exit(1 if differ else 0)
