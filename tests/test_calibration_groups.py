"""dmimo_jax.calibration.groups: each group builds itself on a deployment, sets its own
unknowns on a model, reports its natural values, linearizes to them and names the AP each
unknown moves; the fitting core (dmimo_jax.calibration.solver) and the staging see groups
only through that interface, so a kind of unknown defined in this file is fitted as the
package's own are."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dmimo_jax as dj
from dmimo_jax import receivers as rx
from dmimo_jax.calibration import groups, solver
from dmimo_jax.pytree import pytree_dataclass
from dmimo_jax.scene import Scene

SCENE = dj.paper_scene(-10.0, convention="itu")
MODEL = dj.TwoRayModel(SCENE)
M = SCENE.num_aps


def _on(model):
    """A deployment of ``model`` without data: what a group of the model alone builds on."""
    return groups.Deployment(model, None, None, None)


def test_positions_move_only_the_free_coordinates_and_report_per_ap():
    free = np.zeros((M, 3), bool)
    free[3, 2] = free[5, :] = True
    g = groups.Positions(free_axes=free).build(_on(MODEL))
    assert isinstance(g, groups.Positions) and g.name == "ap_positions" and g.size == 4
    u = jnp.array([0.01, -0.02, 0.03, 0.04])
    moved = np.asarray(g.apply(MODEL, u).scene.ap_positions)
    delta = moved - np.asarray(SCENE.ap_positions)
    want = np.zeros((M, 3))
    want[3, 2], want[5] = 0.01, [-0.02, 0.03, 0.04]
    np.testing.assert_allclose(delta, want, rtol=0, atol=1e-15)
    np.testing.assert_allclose(g.report(g.natural(u)), moved, rtol=0, atol=0)
    # each unknown moves one AP; two unknowns of one AP never share a colour
    ap_of, colour_of = g.per_ap_layout(M)
    assert ap_of == [3, 5, 5, 5] and len(set(colour_of[1:])) == 3


def test_a_position_basis_that_couples_two_aps_has_no_per_ap_layout():
    basis = np.zeros((3 * M, 1))
    basis[0, 0] = basis[3, 0] = 2**-0.5  # AP 0's x and AP 1's x together
    g = groups.Positions(origin=SCENE.ap_positions, basis=jnp.asarray(basis), u0=jnp.zeros(1))
    assert g.per_ap_layout(M) is None


def test_offsets_keep_the_gauge_and_apply_to_the_scene():
    g = groups.Offsets().at(jnp.concatenate([jnp.array([0.3]), jnp.zeros(M - 1)]))
    u = jnp.linspace(-1.0, 1.0, M - 1)
    offsets = np.asarray(g.apply(MODEL, u).scene.ap_phase_offsets)
    assert offsets[0] == 0.3 and np.array_equal(offsets[1:], np.asarray(u))
    assert g.per_ap_layout(M) is None  # an offset moves one AP, but phases only: plain jacfwd


def test_surfaces_are_physical_for_every_u_and_linearize_to_the_same_model():
    (g,) = groups.Surfaces(starts=(5.24 - 0.87j,)).build_starts(_on(MODEL))
    assert g.names == ("ground",) and g.indices == (0,)
    for u in (g.u0, -g.u0, jnp.array([-3.0, 2.0])):
        eps = complex(g.report(g.natural(u))[0])
        assert eps.real >= 1.0 and eps.imag <= 0.0
    u = jnp.array([4.0, -0.6])
    lin, v = g.linearized(u)
    assert lin.linear and complex(lin.report(v)[0]) == pytest.approx(5.0 - 0.6j)
    x = jnp.array([6.0, 5.0, 1.5])
    np.testing.assert_array_equal(
        np.asarray(g.apply(MODEL, u).mean(x)), np.asarray(lin.apply(MODEL, v).mean(x))
    )
    assert float(g.apply(MODEL, u).scene.eps_r.real) == 5.0


def test_antenna_exponent_starts_off_zero_and_reports_its_shape():
    zero = dj.TwoRayModel(SCENE.replace(antenna=dj.CosinePattern(0.0)))
    g = groups.Antenna().build(_on(zero))
    assert float(g.u0[0]) == groups.MIN_EXPONENT_START
    assert g.report(g.natural(jnp.array([-1.5]))).shape == ()  # q = |u|, one shared exponent
    pattern = g.apply(MODEL, jnp.array([-1.5])).scene.antenna
    assert float(pattern.exponent) == 1.5


def test_receiver_groups_apply_gains_after_the_gauge_and_constants():
    recv = rx.Receivers(jnp.ones(M, complex), jnp.zeros(M, complex))
    model = rx.ReceiverModel(MODEL, recv)
    gains = groups.ReceiverGains().build(_on(model))
    consts = groups.ReceiverConstants().build(_on(model))
    u = jnp.concatenate([jnp.full(M - 1, 2.0), jnp.full(M - 1, -1.0)])
    g = np.asarray(gains.apply(model, u).receivers.gains)
    assert g[0] == 1.0 and np.all(g[1:] == 2.0 - 1.0j)
    b = np.asarray(consts.apply(model, jnp.arange(2.0 * M)).receivers.constants)
    np.testing.assert_array_equal(b, np.arange(M) + 1j * np.arange(M, 2 * M))
    assert gains.per_ap_layout(M)[0][: M - 1] == list(range(1, M))
    # the solver's column compression from the groups' own layouts: 4 colours for 2 groups
    colours, aps = solver.per_ap_structure(model, (gains, consts))
    assert colours.shape == (4, 4 * M - 2) and aps.shape == (M, 4 * M - 2)
    assert solver.per_ap_structure(MODEL, (gains,)) is None  # wrapped phases: plain jacfwd


def test_groups_are_pytrees_whose_layout_is_static():
    g = groups.Positions(prior=0.01).build(_on(MODEL))
    leaves, tree = jax.tree_util.tree_flatten(g)
    again = jax.tree_util.tree_unflatten(tree, leaves)
    assert type(again) is groups.Positions and again.name == "ap_positions"
    assert again.prior == 0.01 and g.prior_size == g.size
    # the prior: whitened residuals u / std
    np.testing.assert_allclose(g.prior_residuals(jnp.full(g.size, 0.02)), 2.0, rtol=1e-12)
    # one compiled function serves two groups of the same shapes
    f = jax.jit(lambda grp, u: grp.natural(u))
    shifted = dataclasses.replace(g, origin=g.origin + 1.0)
    assert float(jnp.max(f(shifted, g.u0) - f(g, g.u0))) == pytest.approx(1.0)
    assert f._cache_size() == 1


def _deployments(num, seed=0):
    """``num`` two-ray deployments of the same shapes: surveyed positions 1 cm off, random
    offsets, noisy phases at 30 labeled spots; each with its own positions and offsets groups."""
    from dmimo_jax.calibration import offsets_closed_form

    rng = np.random.default_rng(seed)
    x = jnp.asarray(dj.sample_positions(jax.random.key(seed), 30, SCENE))
    out = []
    for _ in range(num):
        truth = dj.TwoRayModel(
            SCENE.replace(
                ap_positions=np.asarray(SCENE.ap_positions) + rng.normal(0, 1e-2, (M, 3)),
                ap_phase_offsets=rng.uniform(-np.pi, np.pi, M),
            )
        )
        nv = jax.vmap(truth.variance)(x)
        mean = jax.vmap(truth.mean)(x) + rng.uniform(-np.pi, np.pi, (30, 1))
        r = dj.wrap(mean + rng.normal(size=nv.shape) * np.sqrt(np.asarray(nv)))
        start = offsets_closed_form(MODEL, x, r)
        grp = (groups.Positions().build(_on(MODEL)), groups.Offsets().at(start))
        u0 = jnp.concatenate([g.u0 for g in grp])[None]
        out.append((groups.Deployment(MODEL, x, r, nv), grp, u0))
    return x, out


def test_the_fitting_core_vmapped_over_deployments_equals_a_loop():
    """solver.fit_rounds is pure: jax.vmap over four deployments (their groups, snapshots,
    variances and starts stacked) gives each one's fit of the loop to 1e-9, each stopping
    at its own round (the steps differ), and the fits find the worlds' phase centres."""
    x, worlds = _deployments(4)

    def fit(d, grp, u0):
        return solver.fit_rounds(d, grp, u0, 2, 300)  # rounds of 2 LM steps

    loop = [fit(*w) for w in worlds]
    assert len({int(one.steps) for one in loop}) > 1  # the worlds converge after different rounds
    batched = jax.vmap(fit)(*jax.tree.map(lambda *a: jnp.stack(a), *worlds))
    for i, one in enumerate(loop):
        assert bool(one.converged) and bool(batched.converged[i])
        assert int(batched.steps[i]) == int(one.steps)
        np.testing.assert_allclose(batched.u[i], one.u, rtol=0, atol=1e-9)
        assert abs(float(batched.cost[i]) - float(one.cost)) <= 1e-9 * float(one.cost)
        # about chi-square with L M - L - n degrees of freedom: the noise, not a misfit
        assert float(one.cost) / (30 * M - 30 - one.u.shape[0]) < 1.5


@pytree_dataclass
class LineOfSight:
    """A model kind of this test's own (calibration has never heard of it): the LoS path
    alone, a constant noise. It is a CalibratableModel by what it knows of itself."""

    scene: Scene

    piecewise = False

    @property
    def num_aps(self):
        return self.scene.num_aps

    def mean(self, x):
        d = jnp.linalg.norm(jnp.asarray(x)[None, :] - self.scene.ap_positions, axis=-1)
        return -2 * jnp.pi * d / self.scene.wavelength + self.scene.ap_phase_offsets

    def variance(self, x):
        return jnp.full(self.num_aps, 1e-6)

    @property
    def surface_names(self):
        return ()

    def with_scene(self, scene):
        return LineOfSight(scene)

    def with_permittivities(self, eps_r, indices):
        raise AssertionError("a model without surfaces is never given permittivities")

    def mounted(self):
        return [[] for _ in range(self.num_aps)]

    def calibration_surfaces(self, surfaces=None):
        raise ValueError("fit: 'surfaces' asked, but a line-of-sight model has no surface")


def test_a_model_kind_calibration_never_heard_of_is_calibrated_as_it_is():
    """No edit in calibration for a new model kind: its phase centres and offsets are
    recovered from noise-free snapshots, and what it cannot fit it says itself."""
    from dmimo_jax.calibration import calibrate

    assert isinstance(LineOfSight(SCENE), dj.physics.CalibratableModel)
    rng = np.random.default_rng(3)
    world = SCENE.replace(
        ap_positions=np.asarray(SCENE.ap_positions) + rng.normal(0, 1e-2, (M, 3)),
        ap_phase_offsets=rng.uniform(-np.pi, np.pi, M),
    )
    x = jnp.asarray(dj.sample_positions(jax.random.key(4), 30, SCENE))
    truth = LineOfSight(world)
    r = dj.wrap(jax.vmap(truth.mean)(x) + rng.uniform(-np.pi, np.pi, (30, 1)))
    nv = jax.vmap(truth.variance)(x)
    with pytest.warns(UserWarning, match="overstates the noise"):  # noise-free snapshots
        cal = calibrate(LineOfSight(SCENE), x, r, nv, fit=("ap_positions", "ap_phase_offsets"))
    assert type(cal.model) is LineOfSight and cal.status == "noise_overstated"
    np.testing.assert_allclose(cal.values["ap_positions"], world.ap_positions, rtol=0, atol=1e-6)
    offsets = np.angle(
        np.exp(
            1j
            * (
                cal.values["ap_phase_offsets"]
                - (world.ap_phase_offsets - world.ap_phase_offsets[0])
            )
        )
    )
    assert np.max(np.abs(offsets)) < 1e-6
    with pytest.raises(ValueError, match="line-of-sight model has no surface"):
        calibrate(LineOfSight(SCENE), x, r, nv, fit=("surfaces",))
    with pytest.raises(ValueError, match="CalibratableModel"):
        calibrate(object(), x, r, nv, fit=("ap_phase_offsets",))


@pytree_dataclass
class SurveyShift(groups.FitGroup):
    """A kind of unknown of this test's own (calibration has never heard of it): the survey's
    origin off by one translation common to every AP, three unknowns in metres."""

    origin: jax.Array | None = None
    name = "survey_shift"

    def build(self, deployment):
        origin = jnp.asarray(deployment.model.scene.ap_positions)
        return dataclasses.replace(self, origin=origin, u0=jnp.zeros(3, origin.dtype))

    def apply(self, model, u):
        return model.with_scene(model.scene.replace(ap_positions=self.origin + u[None, :]))


def test_a_kind_of_unknown_defined_here_is_fitted_with_no_edit_of_calibration():
    """One new subclass is a new kind of unknown: calibrate builds it, stages it, fits it
    beside the package's own offsets, reports it under its name with a standard error that
    covers the truth, and counts its three unknowns in the degrees of freedom."""
    from dmimo_jax.calibration import calibrate

    shift = np.array([0.012, -0.008, 0.005])
    rng = np.random.default_rng(5)
    offsets = rng.uniform(-np.pi, np.pi, M)
    truth = dj.TwoRayModel(
        SCENE.replace(ap_positions=np.asarray(SCENE.ap_positions) + shift, ap_phase_offsets=offsets)
    )
    x = dj.sample_positions(jax.random.key(7), 40, SCENE)
    r = dj.simulate_phases_batch(jax.random.key(8), truth, x, jnp.asarray(rng.uniform(-3, 3, 40)))
    nv = jax.vmap(truth.variance)(x)
    cal = calibrate(MODEL, x, r, nv, fit=(SurveyShift(), "ap_phase_offsets"))
    assert cal.fit == ("ap_phase_offsets", "survey_shift")  # the package's groups first
    assert cal.status == "converged" and cal.dof == 40 * M - 40 - (M - 1) - 3
    got, se = np.asarray(cal.values["survey_shift"]), np.asarray(cal.stderr["survey_shift"])
    assert got.shape == se.shape == (3,) and np.all(np.isfinite(se)) and np.all(se > 0)
    np.testing.assert_array_less(np.abs(got - shift), 5 * se)  # within five standard errors
    assert np.max(np.abs(got - shift)) < 1e-4  # 0.1 mm: the PEB here is tens of micrometres
    fitted = np.asarray(cal.model.scene.ap_positions) - np.asarray(SCENE.ap_positions)
    np.testing.assert_allclose(fitted, np.broadcast_to(got, (M, 3)), rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="must not repeat"):
        calibrate(MODEL, x, r, nv, fit=(SurveyShift(), SurveyShift()))
