"""Bayesian GP hyperparameters by NUTS (numpyro) against the point estimate, on one case.

Concrete, paper convention, P = -10 dBm, L training UEs (default 10), 200 test UEs.
Prints and writes (``--json``) the modeling RMSE/NLPD of the point-estimate GP and of the
posterior mixture (20 thinned draws, moment matched).

    python examples/gp_nuts.py --json out/gp_nuts.json
"""

from __future__ import annotations

import argparse
import pathlib
import time

import jax

jax.config.update("jax_enable_x64", True)

from _helpers import measurements, write_json  # noqa: E402

import dmimo_jax as dj  # noqa: E402
from dmimo_jax import gp  # noqa: E402
from dmimo_jax.metrics import modeling_score  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--num-train", type=int, default=10)
    ap.add_argument("--samples", type=int, default=50, help="NUTS warm-up and kept draws each")
    ap.add_argument("--power-dbm", type=float, default=-10.0)
    ap.add_argument("--json", type=pathlib.Path, default=None)
    args = ap.parse_args(argv)
    scene = dj.paper_scene(power_dbm=args.power_dbm)
    x, r, nv, _ = measurements(jax.random.key(5), scene, args.num_train)
    xt, rt, _, _ = measurements(jax.random.key(6), scene, 200)
    t0 = time.perf_counter()
    point = gp.fit(x, r, nv, scene)
    t_point = time.perf_counter() - t0
    post = gp.fit_nuts(
        x,
        r,
        nv,
        scene,
        key=jax.random.key(0),
        init=point,
        num_warmup=args.samples,
        num_samples=args.samples,
        progress=False,
    )
    t_nuts = time.perf_counter() - t0 - t_point
    mixture = gp.GPMixtureModel.from_posterior(post, x, r, nv, scene)
    rows = []
    for name, model, seconds in (
        ("point (L-BFGS)", gp.GPPhaseModel.from_fit(point, x, r, nv, scene), t_point),
        ("NUTS mixture", mixture, t_nuts),
        ("theory", dj.TwoRayModel(scene), 0.0),
    ):
        score = modeling_score(model, xt, rt)
        rows.append(
            dict(
                model=name,
                L=args.num_train,
                power_dbm=args.power_dbm,
                rmse_deg=score.rmse_deg,
                nlpd=float(score.nlpd),
                seconds=seconds,
            )
        )
        print(
            f"{name:>15}: RMSE {score.rmse_deg:.4f} deg, NLPD {float(score.nlpd):.3f}, {seconds:.1f} s"
        )
    print(f"NUTS divergences: {int(post.diverging.sum())} of {post.cpo.shape[0]}")
    write_json(args.json, rows)


if __name__ == "__main__":
    main()
