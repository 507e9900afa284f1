"""The package's shape as a contract: layers, public names, pytrees, no hidden state."""

import ast
import importlib.util
import pathlib
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import dmimo_jax as dj
from dmimo_jax import calibration, estimators, gp, pipeline
from dmimo_jax.learning import POPT, POPTConfig, SyntheticBatch, TrainConfig, train

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "dmimo_jax"
SCENE = dj.paper_scene()


def _modules():
    return sorted(PACKAGE.rglob("*.py"))


def test_layers_contract_holds():
    """import-linter's layers contracts in pyproject.toml: nothing imports upward (the
    package's layers, and the estimators' own)."""
    exe = shutil.which("lint-imports") or str(pathlib.Path(sys.executable).parent / "lint-imports")
    out = subprocess.run([exe], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "2 kept, 0 broken" in out.stdout


def test_no_module_holds_more_than_600_lines():
    """A module over 600 lines holds two ideas: split it where they part."""
    long = {
        str(p.relative_to(ROOT)): n
        for p in _modules()
        if (n := len(p.read_text().splitlines())) > 600
    }
    assert not long, long


def _architecture_tree():
    """Each module the tree of docs/architecture.md names, as a path under dmimo_jax/ (a
    folder line ``name/`` opens a package at its indent; a file line names one or more
    ``*.py`` at the indent of its package's entries)."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    block = text.split("## The tree", 1)[1].split("```", 2)[1]
    named, stack = set(), []
    for line in block.splitlines():
        if not line.strip() or line.startswith("dmimo_jax/"):
            continue
        indent = (len(line) - len(line.lstrip())) // 2
        if indent == 0 or line[: 2 * indent].strip():  # another top folder, or a wrapped line
            if indent == 0:
                break
            continue
        word = line.split()[0]
        stack = stack[: indent - 1]
        if word.endswith("/"):
            stack.append(word[:-1])
        for w in line.strip().split("  ")[0].split():
            if w.endswith(".py"):
                named.add("/".join([*stack, w]))
    return named


def test_the_architecture_page_draws_every_module():
    """docs/architecture.md's tree names every module of the package where it is, and no
    module that is not there."""
    actual = {str(p.relative_to(PACKAGE)) for p in _modules() if p.name != "__init__.py"}
    drawn = _architecture_tree() - {"__init__.py"}
    assert actual - drawn == set(), "modules the tree omits"
    assert drawn - actual == set(), "modules the tree names that do not exist"


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_imports_another_modules_private_name(path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("dmimo_jax"):
            private = [a.name for a in node.names if a.name.startswith("_")]
            assert not private, f"{path.name} imports {private} from {node.module}"


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_docstring_holds_a_control_character(path):
    """A backslash escape in a plain docstring (``"\\bar"`` written ``"\bar"``) puts a control
    character where the math was: the rendered formula breaks."""
    import re

    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False) or ""
            found = re.findall(r"[\x00-\x08\x0b\x0c\x0e-\x1f]", doc)
            assert not found, f"{path.name}: {getattr(node, 'name', 'module')} holds {found}"


_MUTABLE = (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_level_mutable_state(path):
    """No module-level dict/list/set (caches, registries) and no weakref caches: a library
    answer may not depend on what an earlier call left behind."""
    source = path.read_text()
    assert "weakref" not in source and "lru_cache" not in source and "functools.cache" not in source
    for node in ast.parse(source).body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = [getattr(t, "id", "?") for t in targets]
            if names == ["__all__"]:
                continue
            assert not isinstance(node.value, _MUTABLE), f"{path.name}: {names} is mutable"


def test_top_level_reaches_each_layers_entry_points():
    for name in ("egs", "refine", "refine_batch", "coarse_to_fine", "window_search", "peb"):
        assert callable(getattr(dj, name))
    assert dj.gp is gp and dj.pipeline is pipeline and dj.estimators is estimators
    assert dj.pipeline.window_search is estimators.window_search  # old name keeps working
    assert dj.pipeline.HIEstimator is dj.learning.HIEstimator
    with pytest.raises(AttributeError):
        dj.no_such_name  # noqa: B018


def test_importing_the_package_leaves_jax_config_alone():
    code = "import jax; import dmimo_jax, dmimo_jax.pipeline; print(jax.config.jax_enable_x64)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.stdout.strip() == "False", out.stderr


def _gp_models():
    truth = dj.TwoRayModel(SCENE)
    k1, k2, k3 = jax.random.split(jax.random.key(3), 3)
    x = dj.sample_positions(k1, 6, SCENE)
    r = dj.simulate_phases_batch(k2, truth, x, dj.random_cpos(k3, 6))
    nv = jax.vmap(truth.variance)(x)
    # the data-driven start (no fit: what is tested is the pytree, not the optimum)
    params, cpo = gp.initial_params(x, r, SCENE), gp.initial_cpos(x, r, SCENE)
    model = gp.GPPhaseModel.from_data(params, cpo, x, r, nv, SCENE)
    table = gp.TabulatedGPModel.from_model(model, dd_step=0.02, num_gamma=8)
    mixture = gp.GPMixtureModel(jax.tree.map(lambda v: jnp.stack([v, v]), model))
    return model, table, mixture


def _public_pytrees():
    grid = estimators.make_grid([1.0, 1.0, 1.0], [2.0, 2.0, 2.0], 0.25)
    model, table, mixture = _gp_models()
    return {
        "Scene": SCENE,
        "TwoRayModel": dj.TwoRayModel(SCENE),
        "Grid": grid,
        "PhasorTable": estimators.phasor_table(SCENE, grid),
        "GPPhaseModel": model,
        "TabulatedGPModel": table,
        "GPMixtureModel": mixture,
        "GPMeanModel": gp.GPMeanModel(model),
        "CellGrid": estimators.cell_grid(SCENE, 1.0),
        "CellTable": estimators.cell_table(SCENE, estimators.cell_grid(SCENE, 3.0), spacing=0.5),
        "Reflector": dj.Reflector((0.0, 0.0, 4.0), (0.0, 0.0, -1.0), 2.7 - 0.15j, name="ceiling"),
        "ImageSourceModel": dj.room_model(SCENE, walls="concrete"),
        "IsotropicPattern": dj.IsotropicPattern(),
        "CosinePattern": dj.CosinePattern(exponent=np.linspace(1.0, 2.0, 17)),
        "DipolePattern": dj.DipolePattern(axis=(1.0, 0.0, 0.0)),
        "Scene(deployment)": SCENE.replace(
            antenna=dj.CosinePattern(1.5), ap_phase_offsets=np.linspace(-1.0, 1.0, 17)
        ),
        "ResidualFieldModel": _residual_field(),
    }


def _residual_field():
    x = dj.sample_positions(jax.random.key(3), 6, SCENE)
    r = dj.wrap(jax.vmap(dj.TwoRayModel(SCENE).mean)(x) + 0.1)
    return calibration.fit_residual_field(dj.TwoRayModel(SCENE), x, r)


# built once, by the worker that runs these tests (not at collection, which every worker does)
PYTREE_NAMES = [
    "CellGrid",
    "CellTable",
    "CosinePattern",
    "DipolePattern",
    "GPMeanModel",
    "GPMixtureModel",
    "GPPhaseModel",
    "Grid",
    "ImageSourceModel",
    "IsotropicPattern",
    "PhasorTable",
    "Reflector",
    "ResidualFieldModel",
    "Scene",
    "Scene(deployment)",
    "TabulatedGPModel",
    "TwoRayModel",
]


@pytest.fixture(scope="module")
def pytrees():
    built = _public_pytrees()
    assert sorted(built) == PYTREE_NAMES
    return built


@pytest.mark.newest  # every public pytree through jit, vmap and flattening (CI's newest leg)
@pytest.mark.parametrize("name", PYTREE_NAMES)
def test_public_pytree_round_trips(name, pytrees):
    obj = pytrees[name]
    leaves, treedef = jax.tree_util.tree_flatten(obj)
    back = jax.tree_util.tree_unflatten(treedef, leaves)
    assert type(back) is type(obj)
    assert jax.tree_util.tree_structure(back) == treedef
    for a, b in zip(jax.tree.leaves(back), leaves, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # keyed flattening names every leaf by attribute
    paths = [p for p, _ in jax.tree_util.tree_flatten_with_path(obj)[0]]
    assert all(isinstance(p[0], jax.tree_util.GetAttrKey) for p in paths)
    # through jit: rebuilt from tracers without running a validating constructor
    out = jax.jit(lambda t: t)(obj)
    assert jax.tree_util.tree_structure(out) == treedef


@pytest.mark.parametrize(
    "name",
    [
        "TwoRayModel",
        "GPPhaseModel",
        "TabulatedGPModel",
        "GPMeanModel",
        "ImageSourceModel",
        "ResidualFieldModel",
    ],
)
def test_phase_models_declare_the_protocol(name, pytrees):
    model = pytrees[name]
    assert isinstance(model, dj.PhaseModel)
    assert model.scene.num_aps == model.num_aps == 17
    x = jnp.array([5.0, 5.0, 1.5])
    assert model.mean(x).shape == model.variance(x).shape == (17,)


def test_map_in_chunks_maps_a_pytree_with_a_remainder():
    """Chunks of one size (7 items at 3: three chunks of 3, the last filled in) give each
    item's own result, for a tuple in and a tuple out, and an empty input maps to empty."""
    from dmimo_jax.pytree import map_in_chunks

    xs = (jnp.arange(7.0), jnp.arange(14.0).reshape(7, 2))
    out = map_in_chunks(lambda a: (a[0] + a[1].sum(), a[0]), xs, 3)
    np.testing.assert_array_equal(out[0], 5 * xs[0] + 1)
    np.testing.assert_array_equal(out[1], xs[0])
    assert map_in_chunks(lambda a: 2 * a, jnp.zeros((0, 2)), 4).shape == (0, 2)


def test_as_phase_model_names_what_is_missing():
    class NoScene:
        num_aps = 17

        def mean(self, x):
            return x

        def variance(self, x):
            return x

    with pytest.raises(ValueError, match="missing scene"):
        dj.as_phase_model(NoScene())


def test_coarse_estimate_follows_further_training():
    """The online stage holds no cache of weights: train a network further and
    coarse_estimate sees the new weights (an earlier cache returned the old outputs)."""
    net = POPT(17, POPTConfig.tiny(), low=SCENE.ue_low, high=SCENE.ue_high, rngs=nnx.Rngs(0))
    rng = np.random.default_rng(0)
    data = SyntheticBatch(
        x=rng.uniform(1.0, 3.0, (90, 3)).astype(np.float32),
        r=rng.uniform(-np.pi, np.pi, (90, 17)).astype(np.float32),
        cpo=np.zeros(90, np.float32),
    )
    r = jnp.asarray(data.r[:4])
    before = np.asarray(pipeline.coarse_estimate(net, r))
    train(net, data, TrainConfig(epochs=2, batch_size=20, peak_lr=1e-2), progress=False)
    after = np.asarray(pipeline.coarse_estimate(net, r))
    np.testing.assert_allclose(after, np.asarray(net(r)), rtol=1e-5, atol=1e-5)
    assert np.max(np.abs(after - before)) > 1e-3


def test_gp_fit_with_random_restarts_needs_a_key():
    truth = dj.TwoRayModel(SCENE)
    x = dj.sample_positions(jax.random.key(0), 4, SCENE)
    r = dj.simulate_phases_batch(jax.random.key(1), truth, x, jnp.zeros(4))
    nv = jax.vmap(truth.variance)(x)
    with pytest.raises(ValueError, match="key"):
        gp.fit(x, r, nv, SCENE, num_restarts=2, num_steps=2)


def test_refine_multistart_keeps_the_lowest_cost_start():
    x = jnp.array([6.5, 5.0, 2.0])
    r = dj.wrap(dj.TwoRayModel(SCENE).mean(x) + 0.3)[None, :]
    far = x + jnp.array([0.0, 0.0, 0.6])  # another basin
    near = x + jnp.array([0.01, -0.01, 0.005])
    out = estimators.refine_multistart(jnp.stack([far, near])[None], r, SCENE)
    assert int(out.index[0]) == 1
    np.testing.assert_allclose(out.x[0], x, atol=1e-9)
    with pytest.raises(ValueError, match="starts"):
        estimators.refine_multistart(jnp.stack([far, near]), r, SCENE)


def test_mle_and_hi_share_one_levenberg_marquardt(monkeypatch):
    """The MLE's refinement and HI's hyperboloid intersection both run the one solver of
    estimators.lm: a spy in its place sees both calls, and each answer is the solver's."""
    from dmimo_jax.estimators import hyperbola, lm, mle

    calls = []

    def spy(residual_fn, x0, **kwargs):
        calls.append(kwargs["num_steps"])
        return lm.levenberg_marquardt(residual_fn, x0, **kwargs)

    monkeypatch.setattr(mle, "levenberg_marquardt", spy)
    monkeypatch.setattr(hyperbola, "levenberg_marquardt", spy)
    x = jnp.array([6.5, 5.0, 2.0])
    model = dj.TwoRayModel(SCENE)
    r = dj.wrap(model.mean(x) + 0.3)
    # step counts no other test uses, so the jitted functions trace anew and call the spy
    fit = estimators.refine(x + 0.004, r, model, num_steps=13)
    assert calls == [13]
    np.testing.assert_allclose(fit.x, x, atol=1e-9)
    ap, lam = SCENE.ap_positions, SCENE.wavelength
    r_los = dj.wrap(2 * jnp.pi * jnp.linalg.norm(ap - x[None, :], axis=-1) / lam + 0.3)
    n = hyperbola.ambiguities(r_los, x, ap, lam)
    xh = hyperbola.intersect(r_los, n, ap, lam, (x + 0.01)[None, :], num_steps=17)
    assert calls == [13, 17]
    np.testing.assert_allclose(xh, x, atol=1e-6)


def test_the_damped_step_solve_is_lapacks_on_ill_conditioned_systems():
    """lm.solve_damped (the unrolled Cholesky of each LM step, n <= 4; LAPACK above) equals
    numpy's LU solve to 1e-9 relative on damped normal matrices whose columns differ by up to
    1e5 in scale, for n = 1..5; a matrix that is not positive definite gives NaN (the step is
    then rejected), never a silent answer."""
    from dmimo_jax.estimators.lm import solve_damped

    rng = np.random.default_rng(0)
    scales = np.array([1e3, 1.0, 1e-2, 1.0, 1.0])
    for n in range(1, 6):
        for _ in range(20):
            j = rng.normal(size=(7, n)) * scales[:n]
            a = j.T @ j + 1e-3 * np.diag(np.diag(j.T @ j))
            b = rng.normal(size=n)
            got = np.asarray(solve_damped(jnp.asarray(a), jnp.asarray(b)))
            np.testing.assert_allclose(got, np.linalg.solve(a, b), rtol=1e-9, atol=0)
    indefinite = jnp.array([[1.0, 2.0, 0.0], [2.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    assert bool(jnp.any(jnp.isnan(solve_damped(indefinite, jnp.ones(3)))))


def test_every_public_name_is_documented_and_the_top_level_has_the_nouns_users_compose():
    import importlib
    import inspect
    import pathlib
    import types

    pages = pathlib.Path(__file__).parents[1] / "docs" / "api"
    modules = ["dmimo_jax"] + [
        f"dmimo_jax.{p.stem}" for p in pages.glob("*.md") if p.stem != "index"
    ]
    # a constant's docstring is the string after its assignment at some module's top (what
    # the API reference reads: without one it shows no entry)
    constants = set().union(*map(_documented_constants, _modules()))
    undocumented = []
    for name in modules:
        module = importlib.import_module(name)
        for public in module.__all__:
            obj = getattr(module, public)  # every name in __all__ exists
            if isinstance(obj, types.ModuleType):
                continue
            if not callable(obj):
                if public not in constants:
                    undocumented.append(f"{name}.{public}")
                continue
            doc = (inspect.getdoc(obj) or "").strip()
            # a NamedTuple's generated docstring repeats its signature: not documentation
            if not doc or doc.startswith(f"{getattr(obj, '__name__', public)}("):
                undocumented.append(f"{name}.{public}")
    assert not undocumented, undocumented
    for noun in ("calibrate", "run_offline", "Locator", "Tracker", "MeshModel", "Face"):
        assert noun in dj.__all__ and getattr(dj, noun) is not None


def _documented_constants(path):
    """The module-level names of ``path`` that a string statement right after their
    assignment documents (what the API reference reads as their description)."""
    body = ast.parse(path.read_text()).body
    out = set()
    for stmt, nxt in zip(body, body[1:], strict=False):
        target = stmt.targets[0] if isinstance(stmt, ast.Assign) else getattr(stmt, "target", None)
        doc = isinstance(nxt, ast.Expr) and isinstance(getattr(nxt, "value", None), ast.Constant)
        if isinstance(target, ast.Name) and doc and isinstance(nxt.value.value, str):
            out.add(target.id)
    return out


def test_each_public_name_has_one_home():
    """A name is public where an ``__all__`` lists it: the package's top level and the modules
    with an API page. Each object is listed once; a subpackage's modules are its
    implementation (no ``__all__``), and the top level holds the nouns, not the internals."""
    import collections
    import importlib
    import pathlib
    import pkgutil
    import types

    pages = {p.stem for p in (pathlib.Path(__file__).parents[1] / "docs" / "api").glob("*.md")}
    documented = {"dmimo_jax"} | {f"dmimo_jax.{p}" for p in pages if p != "index"}
    homes = collections.defaultdict(list)
    for info in [None, *pkgutil.walk_packages(dj.__path__, "dmimo_jax.")]:
        name = "dmimo_jax" if info is None else info.name
        module = importlib.import_module(name)
        if not hasattr(module, "__all__"):
            continue
        assert name in documented, f"{name} has an __all__ but no API page"
        for public in module.__all__:
            obj = getattr(module, public)
            if not isinstance(obj, types.ModuleType):
                homes[(public, id(obj))].append(name)
    twice = {k[0]: v for k, v in homes.items() if len(v) > 1}
    assert not twice, twice
    for internal in ("efim_schur", "jacobian_analytic", "simulate_phases_exact_batch"):
        assert internal not in dj.__all__ and not hasattr(dj, internal)


def test_the_readme_script_is_the_example_that_runs():
    root = pathlib.Path(__file__).parents[1]
    readme = (root / "README.md").read_text()
    start = readme.index("```python\n") + len("```python\n")
    block = readme[start : readme.index("```", start)]
    assert block in (root / "examples" / "calibrate_and_locate.py").read_text()
    assert len(readme.splitlines()) <= 120


def test_every_python_block_of_the_site_runs_or_says_why():
    """.ci/check_snippets.py: each ```python block of docs/ is executed at build, a doctest,
    or marked ``<!-- not run: REASON -->``."""
    out = subprocess.run(
        [sys.executable, str(ROOT / ".ci" / "check_snippets.py"), str(ROOT / "docs")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_math_check_finds_a_remote_mathjax_and_an_eaten_backslash(tmp_path):
    """.ci/check_math.py's static half: a page that loads MathJax from another host, or
    whose equation holds a control character (``"\\frac"`` in a Python string is a form
    feed and ``rac``), is named; a page served with its own MathJax passes."""
    spec = importlib.util.spec_from_file_location("check_math", ROOT / ".ci" / "check_math.py")
    check_math = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check_math)
    (tmp_path / "javascripts" / "mathjax").mkdir(parents=True)
    (tmp_path / check_math.MATHJAX).write_text("")
    local = f'<script src="../{check_math.MATHJAX}"></script>'
    good = '<span class="arithmatex">\\(\\boldsymbol{x}\\)</span>'
    (tmp_path / "good").mkdir()
    (tmp_path / "good" / "index.html").write_text(local + good)
    findings, counts = check_math.static_findings(tmp_path)
    assert findings == [] and counts == {"pages": 1, "pages_with_math": 1, "equations": 1}
    cdn = '<script src="https://cdn.jsdelivr.net/npm/mathjax@3/es5/tex-chtml.js"></script>'
    (tmp_path / "cdn.html").write_text(cdn + good)
    (tmp_path / "eaten.html").write_text(local + '<div class="arithmatex">\\[\frac{1}{2}\\]</div>')
    findings, _ = check_math.static_findings(tmp_path)
    assert any(f.startswith("cdn.html: loads https://cdn.jsdelivr.net") for f in findings)
    assert any(f.startswith("cdn.html: 1 equations but no") for f in findings)
    assert any(f.startswith("eaten.html: control characters ['\\\\x0c']") for f in findings)
    assert len(findings) == 3


def test_the_slow_tier_keeps_the_tests_of_a_module_fixture_together(tmp_path):
    """conftest.py's ``shared_fixture_files``: the test files that define a module or session
    fixture (whose tests the slow tier runs on one worker, so that one worker builds it), not
    those with function fixtures only, nor files that are not Python or not there."""
    # the module pytest loaded (executing the file again would append its XLA flags again)
    import conftest as root_conftest

    assert pathlib.Path(root_conftest.__file__) == ROOT / "conftest.py"
    (tmp_path / "tests").mkdir()
    files = {
        "tests/test_a.py": '@pytest.fixture(scope="module")\ndef built():\n    return 1\n',
        "tests/test_b.py": "@pytest.fixture\ndef built():\n    return 1\n",
        "tests/test_c.py": "@pytest.fixture(\n    scope='session'\n)\ndef built():\n    return 1\n",
        "tests/test_d.py": '@pytest.fixture(params=[(1, 2)], scope="module")\ndef built():\n    return 1\n',
        "tests/test_e.py": '@pytest.fixture(params=["scope"])\ndef built():\n    return 1\n',
        "tests/notes.md": '@pytest.fixture(scope="module")\n',
    }
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    found = root_conftest.shared_fixture_files(tmp_path, {*files, "tests/test_gone.py"})
    assert found == {"tests/test_a.py", "tests/test_c.py", "tests/test_d.py"}
    # this suite's own: the trained Locator of tests/test_locator.py, none in test_physics.py
    mine = root_conftest.shared_fixture_files(
        ROOT, {"tests/test_locator.py", "tests/test_physics.py"}
    )
    assert mine == {"tests/test_locator.py"}
