"""The README's script: a deployment as it is -> dj.calibrate -> dj.run_offline -> dj.Locator.

Run: ``python examples/calibrate_and_locate.py`` (prints RMSE / mean PEB of 256 new snapshots).
"""

import jax
import numpy as np

jax.config.update("jax_enable_x64", True)  # physics in float64; importing dmimo_jax never sets it
import dmimo_jax as dj

truth, surveyed, nominal = dj.synthetic_deployment(seed=0)  # the world is hidden from the methods


def snapshots(seed, num):  # positions, wrapped phases (random CPOs)
    x = dj.sample_positions(jax.random.key(seed), num, surveyed)
    cpo = dj.random_cpos(jax.random.key(seed + 1), num)
    return x, dj.simulate_phases_batch(jax.random.key(seed + 2), truth, x, cpo)


x, r = snapshots(0, 50)  # L = 50 labeled snapshots
noise_var = jax.vmap(truth.variance)(x)
cal = dj.calibrate(nominal, x, r, noise_var, fit=("ap_positions", "ap_phase_offsets", "surfaces"))
offline = dj.run_offline(x, r, noise_var, surveyed, model=cal, kinds=("cells",), preset="quick")
locate = dj.Locator.from_offline(offline, "cells")

x_test, r_test = snapshots(10, 256)
err = np.linalg.norm(np.asarray(locate(r_test).x - x_test), axis=1)
print(np.sqrt(np.mean(err**2)) / np.asarray(dj.peb_map(x_test, truth)).mean())  # RMSE / PEB
