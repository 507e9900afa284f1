r"""Bayesian option (beyond the paper's point estimate): NUTS over the GP hyperparameters.

numpyro is imported only when :func:`fit_nuts` runs, the way tinygp keeps its numpyro
support apart. :class:`GPMixtureModel` turns the posterior into a PhaseModel.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array
from jax.typing import ArrayLike

from dmimo_jax.gp.fit import GPFit, fit, initial_params
from dmimo_jax.gp.kernel import GPParams, check_training_data, log_marginal_likelihood
from dmimo_jax.gp.model import GPPhaseModel
from dmimo_jax.phase import angle_diff, circular_mean
from dmimo_jax.pytree import pytree_dataclass
from dmimo_jax.scene import Scene


class GPPosterior(NamedTuple):
    """Output of :func:`fit_nuts`: posterior draws (leading axis = draws)."""

    params: GPParams
    """Each field (S,)."""
    cpo: Array
    """(S, L)."""
    diverging: Array
    """(S,) bool, NUTS divergences."""


def fit_nuts(
    x: ArrayLike,
    r: ArrayLike,
    noise_var: ArrayLike,
    scene: Scene,
    *,
    key: Array,
    num_warmup: int = 300,
    num_samples: int = 300,
    prior_scale: float = 2.0,
    init: GPFit | None = None,
    max_tree_depth: int = 10,
    progress: bool = False,
) -> GPPosterior:
    r"""Hyperparameter inference by NUTS (numpyro), next to the point estimate of :func:`fit`.

    Model: :math:`\log\psi_j \sim \mathcal N(\log\psi_j^{(0)}, s^2)` around the data-driven
    start values (:func:`initial_params`, ``s = prior_scale``); CPOs
    :math:`\phi_i \sim \mathcal U[-\pi, \pi)` as latent variables; the likelihood is eq. (23)
    (tinygp), added with ``numpyro.factor``. The chain starts at the point estimate
    (``init``, or a fresh :func:`fit`), which saves most of the warm-up. ``max_tree_depth``
    is NUTS's (numpyro's default, 10: at most 1,023 leapfrog steps per draw, each a
    likelihood and its gradient); a smaller depth bounds the cost of a short chain.
    """
    import numpyro
    import numpyro.distributions as dist
    from numpyro.infer import MCMC, NUTS, init_to_value

    check_training_data(x, r, noise_var, scene.num_aps)
    x, r, noise_var = (jnp.asarray(v, scene.ap_positions.dtype) for v in (x, r, noise_var))
    start = fit(x, r, noise_var, scene) if init is None else init
    center = initial_params(x, r, scene)
    names = GPParams._fields

    def model():
        params = GPParams(
            *(
                numpyro.sample(n, dist.Normal(c, prior_scale))
                for n, c in zip(names, center, strict=True)
            )
        )
        cpo = numpyro.sample("cpo", dist.Uniform(-jnp.pi, jnp.pi).expand([x.shape[0]]).to_event(1))
        numpyro.factor(
            "log_marginal_likelihood", log_marginal_likelihood(params, cpo, x, r, noise_var, scene)
        )

    values = dict(zip(names, start.params, strict=True))
    values["cpo"] = jnp.clip(start.cpo, -jnp.pi + 1e-6, jnp.pi - 1e-6)
    kernel = NUTS(model, init_strategy=init_to_value(values=values), max_tree_depth=max_tree_depth)
    mcmc = MCMC(kernel, num_warmup=num_warmup, num_samples=num_samples, progress_bar=progress)
    mcmc.run(key, extra_fields=("diverging",))
    draws = mcmc.get_samples()
    params = GPParams(*(draws[n] for n in names))
    diverging = mcmc.get_extra_fields()["diverging"]
    return GPPosterior(params, draws["cpo"], diverging)


@pytree_dataclass
class GPMixtureModel:
    r"""A PhaseModel averaging :class:`GPPhaseModel` s over posterior draws (moment matched).

    ``mean`` = average of the draws' means; ``variance`` = average variance + variance of
    the means (law of total variance).
    """

    stacked: GPPhaseModel
    """A GPPhaseModel whose leaves carry a leading draw axis."""

    @classmethod
    def from_posterior(
        cls,
        post: GPPosterior,
        x: ArrayLike,
        r: ArrayLike,
        noise_var: ArrayLike,
        scene: Scene,
        *,
        num_draws: int = 20,
    ) -> GPMixtureModel:
        """Condition ``num_draws`` evenly thinned draws on the training data and stack them."""
        total = post.cpo.shape[0]
        pick = np.linspace(0, total - 1, min(num_draws, total)).astype(int)
        # a constant c moved between all CPOs and g leaves eq. (23) almost unchanged (only
        # the zero-mean prior pins it): align every draw's CPOs to the first draw's gauge so
        # that the spread of the draws' means does not count that arbitrary constant
        ref = post.cpo[pick[0]]
        models = []
        for i in pick:
            cpo = post.cpo[i] - circular_mean(angle_diff(post.cpo[i], ref))
            params = GPParams(*(v[i] for v in post.params))
            models.append(GPPhaseModel.from_data(params, cpo, x, r, noise_var, scene))
        return cls(jax.tree.map(lambda *leaves: jnp.stack(leaves), *models))

    @property
    def scene(self) -> Scene:
        """The scene of the first draw (all draws share the geometry)."""
        return jax.tree.map(lambda v: v[0], self.stacked.scene)

    @property
    def num_aps(self) -> int:
        """The number of APs, M."""
        return self.stacked.scene.ap_positions.shape[-2]

    def _each(self, fn, x):
        return jax.vmap(lambda m: fn(m, x))(self.stacked)

    def mean(self, x: ArrayLike) -> Array:
        return jnp.mean(self._each(GPPhaseModel.mean, x), axis=0)

    def variance(self, x: ArrayLike) -> Array:
        means = self._each(GPPhaseModel.mean, x)
        return jnp.mean(self._each(GPPhaseModel.variance, x), axis=0) + jnp.var(means, axis=0)
