r"""The deployment: a :class:`Scene` pytree, unit helpers and AP and UE sampling (scenes from
a plan, a file or the paper: :mod:`dmimo_jax.deployments`).

Sec. II-A and Sec. VI of the paper: M single-antenna APs at known positions on the
ceiling, a ground plane z = 0 with complex relative permittivity :math:`\varepsilon_r`,
transmit power P and complex noise power :math:`\sigma_w^2 = k_B T W \cdot NF`.

Beyond the paper, the deployment as it really is: each AP's static phase offset
:math:`\delta_m` (imperfect phase synchronization; zero by default) and its antenna's
field pattern (:mod:`dmimo_jax.antenna`; isotropic by default). Both default to the paper.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array
from jax.typing import ArrayLike

from dmimo_jax._checks import check_finite, check_int, check_permittivity, is_concrete
from dmimo_jax.antenna import AntennaPattern, IsotropicPattern, check_pattern, is_isotropic
from dmimo_jax.pytree import pytree_dataclass, static_field

__all__ = [
    "SPEED_OF_LIGHT",
    "pack_greedily",
    "BOLTZMANN_PAPER",
    "dbm_to_watt",
    "watt_to_dbm",
    "db_to_linear",
    "thermal_noise_power",
]

SPEED_OF_LIGHT = 299_792_458.0
"""The speed of light, m/s."""
BOLTZMANN_PAPER = 1.38e-23
"""Boltzmann's constant as the paper rounds it (Sec. VI), J/K."""

Polarization = Literal["TE", "TM"]


def _float_dtype(dtype: Any = None) -> Any:
    return jnp.result_type(float) if dtype is None else dtype


def _complex_dtype(float_dtype: Any) -> Any:
    return jnp.complex128 if jnp.dtype(float_dtype) == jnp.float64 else jnp.complex64


@pytree_dataclass(init=False)
class Scene:
    r"""A D-MIMO deployment over a reflecting ground plane (a JAX pytree).

    Array fields are pytree leaves, so ``jax.grad`` reaches e.g. ``eps_r`` or the AP
    positions; ``polarization`` and ``perfect_conductor`` are static.

    Attributes:
        ap_positions: (M, 3) AP positions :math:`\mathbf{p}_m` in metres, z > 0.
        wavelength: () carrier wavelength :math:`\lambda` in metres.
        eps_r: () complex relative permittivity of the ground (ignored for a perfect conductor).
        tx_power: () transmit power P in watts.
        noise_power: () complex noise power :math:`\sigma_w^2` in watts.
        ue_low, ue_high: (3,) corners of the box UE positions are drawn from (metres).
        room_size: (3,) room extent [0, Lx] x [0, Ly] x [0, Lz] in metres (the EGS search box).
        ap_phase_offsets: (M,) static per-AP phase offsets :math:`\delta_m` in radians (default
            zeros): every PhaseModel's mean is :math:`\theta_m(\mathbf x) + \delta_m`, so the
            measured phase is :math:`\mathrm{wrap}(\theta_m + \delta_m + \phi + n_m)`. Only the
            differences between APs are observable (a common part is the CPO); known
            offsets leave the PEB unchanged.
        antenna: the APs' field pattern (:mod:`dmimo_jax.antenna`): one pattern for all APs,
            with per-AP parameters by broadcasting; default :class:`IsotropicPattern`.
        polarization: ``"TE"`` (paper) or ``"TM"``.
        perfect_conductor: ground is a perfect electric conductor, :math:`\Gamma = -1`.

    Construct with keyword arguments; concrete inputs are validated (``ValueError``).
    """

    ap_positions: Array
    wavelength: Array
    eps_r: Array
    tx_power: Array
    noise_power: Array
    ue_low: Array
    ue_high: Array
    room_size: Array
    ap_phase_offsets: Array
    antenna: AntennaPattern
    polarization: Polarization = static_field()
    perfect_conductor: bool = static_field()

    _LEAVES = (
        "ap_positions",
        "wavelength",
        "eps_r",
        "tx_power",
        "noise_power",
        "ue_low",
        "ue_high",
        "room_size",
        "ap_phase_offsets",
    )

    def __init__(
        self,
        *,
        ap_positions: ArrayLike,
        wavelength: ArrayLike,
        eps_r: ArrayLike,
        tx_power: ArrayLike,
        noise_power: ArrayLike,
        ue_low: ArrayLike,
        ue_high: ArrayLike,
        room_size: ArrayLike | None = None,
        ap_phase_offsets: ArrayLike | None = None,
        antenna: AntennaPattern | None = None,
        polarization: Polarization = "TE",
        perfect_conductor: bool = False,
        dtype: Any = None,
    ):
        fdt = _float_dtype(dtype)
        cdt = _complex_dtype(fdt)
        for name, v in (
            ("ap_positions", ap_positions),
            ("wavelength", wavelength),
            ("tx_power", tx_power),
            ("noise_power", noise_power),
            ("ue_low", ue_low),
            ("ue_high", ue_high),
            ("room_size", room_size),
            ("ap_phase_offsets", ap_phase_offsets),
        ):
            if v is not None and jnp.iscomplexobj(v):
                raise ValueError(
                    f"{name} must be real, got a complex array (dtype {jnp.asarray(v).dtype})"
                )
        if polarization not in ("TE", "TM"):
            raise ValueError(f"polarization must be 'TE' or 'TM', got {polarization!r}")
        ap = jnp.asarray(ap_positions, fdt)
        if ap.ndim != 2 or ap.shape[-1] != 3 or ap.shape[0] < 1:
            raise ValueError(f"ap_positions must have shape (M, 3) with M >= 1, got {ap.shape}")
        for name, v in (("ue_low", ue_low), ("ue_high", ue_high), ("room_size", room_size)):
            if v is not None and np.shape(v) != (3,):
                raise ValueError(f"{name} must have shape (3,), got {np.shape(v)}")
        if room_size is None:
            room_size = jnp.maximum(jnp.asarray(ue_high, fdt), jnp.max(ap, axis=0))
        if ap_phase_offsets is None:
            ap_phase_offsets = jnp.zeros(ap.shape[:1], fdt)
        if np.shape(ap_phase_offsets) != ap.shape[:1]:
            raise ValueError(
                f"ap_phase_offsets must have shape ({ap.shape[0]},) (one offset per AP, rad), "
                f"got {np.shape(ap_phase_offsets)}"
            )
        antenna = IsotropicPattern() if antenna is None else antenna
        check_pattern("antenna", antenna, ap.shape[0])
        values = {
            "ap_positions": ap,
            "wavelength": jnp.asarray(wavelength, fdt),
            "eps_r": jnp.asarray(eps_r, cdt),
            "tx_power": jnp.asarray(tx_power, fdt),
            "noise_power": jnp.asarray(noise_power, fdt),
            "ue_low": jnp.asarray(ue_low, fdt),
            "ue_high": jnp.asarray(ue_high, fdt),
            "room_size": jnp.asarray(room_size, fdt),
            "ap_phase_offsets": jnp.asarray(ap_phase_offsets, fdt),
        }
        for k, v in values.items():
            object.__setattr__(self, k, v)
        object.__setattr__(self, "antenna", antenna)
        object.__setattr__(self, "polarization", polarization)
        object.__setattr__(self, "perfect_conductor", bool(perfect_conductor))
        self._validate()

    def _validate(self) -> None:
        ap = self.ap_positions
        for name in ("wavelength", "eps_r", "tx_power", "noise_power"):
            if getattr(self, name).shape != ():
                raise ValueError(f"{name} must be a scalar, got shape {getattr(self, name).shape}")
        for name in ("ue_low", "ue_high", "room_size"):
            if getattr(self, name).shape != (3,):
                raise ValueError(f"{name} must have shape (3,), got {getattr(self, name).shape}")
        if not is_concrete(*(getattr(self, k) for k in self._LEAVES)):
            return
        for name in self._LEAVES:
            check_finite(name, getattr(self, name))
        # NumPy on the concrete leaves: a jnp operation inside a jit trace (a scene built
        # there with a traced pattern) would be staged out and give a tracer
        ap_z = np.asarray(ap)[:, 2]
        if np.any(ap_z <= 0):
            raise ValueError(
                f"ap_positions must lie above the ground plane (z > 0 m), got z = {ap_z.min():.6g} m"
            )
        for name in ("wavelength", "tx_power", "noise_power"):
            if float(getattr(self, name)) <= 0:
                raise ValueError(f"{name} must be positive, got {float(getattr(self, name))!r}")
        if not self.perfect_conductor:
            check_permittivity("eps_r", self.eps_r)
        if np.any(np.asarray(self.room_size) <= 0):
            raise ValueError(f"room_size must be positive (m), got {np.asarray(self.room_size)}")
        low, high = np.asarray(self.ue_low), np.asarray(self.ue_high)
        if np.any(low > high):
            raise ValueError(f"ue_low must be <= ue_high elementwise, got {low} and {high}")
        if low[2] <= 0:
            raise ValueError(f"ue_low[2] must be > 0 (UEs above the ground), got {low[2]}")

    # -- conveniences --
    @property
    def num_aps(self) -> int:
        """M, the number of APs."""
        return self.ap_positions.shape[0]

    @property
    def frequency(self) -> Array:
        """Carrier frequency c / lambda in Hz."""
        return SPEED_OF_LIGHT / self.wavelength

    @property
    def has_phase_offsets(self) -> bool:
        """Whether any AP has a non-zero static phase offset (``True`` when traced)."""
        if not is_concrete(self.ap_phase_offsets):
            return True
        return bool(np.any(np.asarray(self.ap_phase_offsets) != 0))

    def replace(self, **changes: Any) -> Scene:
        """A copy with some fields replaced (validated like the constructor).

        New ``ap_positions`` with another number of APs reset all-zero phase offsets to
        zeros of the new size; non-zero offsets must then be replaced too.
        """
        kwargs = {k: getattr(self, k) for k in self._LEAVES}
        kwargs.update(
            polarization=self.polarization,
            perfect_conductor=self.perfect_conductor,
            antenna=self.antenna,
        )
        new_m = np.shape(changes.get("ap_positions", self.ap_positions))[0]
        if new_m != self.num_aps and "ap_phase_offsets" not in changes:
            if self.has_phase_offsets:
                raise ValueError(
                    f"ap_positions now has {new_m} APs but the scene has phase offsets for "
                    f"{self.num_aps}: pass ap_phase_offsets too"
                )
            kwargs["ap_phase_offsets"] = None
        kwargs["dtype"] = self.ap_positions.dtype
        kwargs.update(changes)
        return Scene(**kwargs)

    def subset(self, aps: ArrayLike) -> Scene:
        """The scene of the APs ``aps`` ((K,) indices) alone: their positions, phase offsets
        and per-AP antenna parameters, everything else unchanged (a tile's deployment,
        :mod:`dmimo_jax.tiles`).

        Raises:
            ValueError: ``aps`` not distinct indices of this scene's APs, or fewer than 1.
        """
        idx = np.asarray(aps)
        m = self.num_aps
        if idx.ndim != 1 or idx.size < 1 or idx.dtype.kind not in "iu":
            raise ValueError(f"aps must be a (K,) array of AP indices, got {idx.dtype} {idx.shape}")
        if np.any((idx < 0) | (idx >= m)) or len(np.unique(idx)) != idx.size:
            raise ValueError(f"aps must be distinct indices in [0, {m}), got {idx.tolist()}")
        pick = lambda a: a[idx] if np.ndim(a) >= 1 and np.shape(a)[0] == m else a  # noqa: E731
        return self.replace(
            ap_positions=self.ap_positions[idx],
            ap_phase_offsets=self.ap_phase_offsets[idx],
            antenna=jax.tree.map(pick, self.antenna),
        )

    def astype(self, dtype: Any) -> Scene:
        """The same scene with float leaves cast to ``dtype`` (complex to its complex pair)."""
        return self.replace(dtype=dtype)

    def __repr__(self) -> str:
        return (
            f"Scene(M={self.num_aps}, wavelength={float(self.wavelength):.6g} m, "
            f"eps_r={complex(self.eps_r):.6g}, polarization={self.polarization!r}, "
            f"perfect_conductor={self.perfect_conductor}, "
            + ("" if is_isotropic(self.antenna) else f"antenna={type(self.antenna).__name__}, ")
            + ("phase offsets, " if self.has_phase_offsets else "")
            + f"tx_power={watt_to_dbm(float(self.tx_power)):.3g} dBm, "
            f"noise_power={float(self.noise_power):.4g} W)"
            if is_concrete(self.wavelength, self.eps_r, self.tx_power, self.noise_power)
            else f"Scene(M={self.num_aps}, traced)"
        )


def dbm_to_watt(p_dbm: ArrayLike) -> Array:
    """Power in dBm to watts: :math:`10^{(P_{dBm}-30)/10}`."""
    return 10.0 ** ((jnp.asarray(p_dbm, float) - 30.0) / 10.0)


def watt_to_dbm(p_w: ArrayLike) -> Array:
    """Power in watts to dBm: :math:`10\\log_{10}(P) + 30`."""
    return 10.0 * jnp.log10(jnp.asarray(p_w, float)) + 30.0


def db_to_linear(x_db: ArrayLike) -> Array:
    """Decibels to a linear power ratio, :math:`10^{x/10}`."""
    return 10.0 ** (jnp.asarray(x_db, float) / 10.0)


def thermal_noise_power(
    bandwidth_hz: float,
    *,
    temperature_k: float = 290.0,
    noise_figure_db: float = 3.0,
    boltzmann: float = BOLTZMANN_PAPER,
) -> float:
    r"""Complex noise power :math:`\sigma_w^2 = k_B T W \cdot NF` in watts (Sec. VI).

    Examples:
        >>> round(thermal_noise_power(180e3) * 1e15, 4)  # paper: W=180 kHz, T=290 K, NF=3 dB
        1.4373
    """
    for name, v in (("bandwidth_hz", bandwidth_hz), ("temperature_k", temperature_k)):
        if not (np.isfinite(v) and v > 0):
            raise ValueError(f"{name} must be positive and finite, got {v!r}")
    for name, v in (("noise_figure_db", noise_figure_db), ("boltzmann", boltzmann)):
        if not np.isfinite(v):
            raise ValueError(f"{name} must be finite, got {v!r}")
    return boltzmann * temperature_k * bandwidth_hz * 10.0 ** (noise_figure_db / 10.0)


def pack_greedily(candidates: np.ndarray, num: int, min_separation: float) -> np.ndarray | None:
    """The first ``num`` rows of ``candidates`` (N, D) accepted in order when at least
    ``min_separation`` from every row accepted before (sequential random packing), or
    ``None`` when the candidates run out first."""
    accepted: list[np.ndarray] = []
    for c in np.asarray(candidates):
        if all(np.linalg.norm(c - a) >= min_separation for a in accepted):
            accepted.append(c)
            if len(accepted) == num:
                return np.stack(accepted)
    return None


def sample_ap_positions(
    key: Array,
    num_aps: int,
    *,
    room_size: tuple[float, float] = (10.0, 10.0),
    height: float = 4.0,
    min_separation: float = 1.0,
    margin: float = 0.5,
    max_candidates: int = 100_000,
) -> Array:
    """Random AP deployment on a ceiling with a minimum pairwise separation (seeded).

    Candidates are drawn uniformly on ``[margin, Lx - margin] x [margin, Ly - margin]``
    at ``z = height`` and accepted greedily in draw order when they are at least
    ``min_separation`` from every accepted AP (sequential random packing). Same key,
    same layout.

    Returns:
        (num_aps, 3) positions in metres.

    Raises:
        ValueError: if the room cannot hold ``num_aps`` APs at that separation.
    """
    if num_aps < 1:
        raise ValueError(f"num_aps must be >= 1, got {num_aps}")
    if not (np.isfinite(height) and height > 0):
        raise ValueError(f"height must be finite and > 0 m (APs above the ground), got {height}")
    if not (np.isfinite(min_separation) and min_separation >= 0 and np.isfinite(margin)):
        raise ValueError(
            f"min_separation and margin must be finite, min_separation >= 0, got "
            f"{min_separation}, {margin}"
        )
    lx, ly = room_size
    if not (lx > 2 * margin and ly > 2 * margin):
        raise ValueError(f"room_size {room_size} must exceed 2 * margin = {2 * margin}")
    cand = np.asarray(
        jax.random.uniform(
            key,
            (max_candidates, 2),
            minval=jnp.array([margin, margin]),
            maxval=jnp.array([lx - margin, ly - margin]),
        )
    )
    xy = pack_greedily(cand, num_aps, min_separation)
    if xy is not None:
        return jnp.asarray(np.column_stack([xy, np.full(num_aps, height)]))
    raise ValueError(
        f"could not place num_aps={num_aps} APs with min_separation={min_separation} m in "
        f"a {lx} x {ly} m ceiling after {max_candidates} candidates; lower min_separation"
    )


def sample_positions(key: Array, num: int, scene: Scene) -> Array:
    """``num`` UE positions uniform in the scene's box ``[ue_low, ue_high]``, shape (num, 3)."""
    check_int("num", num)
    return _sample_positions(key, num, scene)


@partial(jax.jit, static_argnums=1)
def _sample_positions(key: Array, num: int, scene: Scene) -> Array:
    u = jax.random.uniform(key, (num, 3), dtype=scene.ue_low.dtype)
    return scene.ue_low[None, :] + u * (scene.ue_high - scene.ue_low)[None, :]


def perturb_deployment(
    key: Array,
    scene: Scene,
    *,
    position_std: float = 5e-3,
    axes: tuple[int, ...] = (0, 1, 2),
    random_offsets: bool = True,
) -> Scene:
    r"""A deployment as it really is: the surveyed ``scene`` with each AP's phase centre off
    by :math:`\mathcal N(0, \sigma^2)` along ``axes`` (e.g. ``(0, 1)``: lateral only, for APs
    mounted on the ceiling) and, with ``random_offsets``, per-AP phase offsets uniform on
    :math:`[-\pi, \pi)` (unsynchronized oscillators). Same key, same world.

    Raises:
        ValueError: ``scene`` not a Scene, a negative or non-finite ``position_std``, axes
            outside {0, 1, 2}, or a perturbation that puts an AP below the ground.
    """
    if not isinstance(scene, Scene):
        raise ValueError(
            f"scene must be a Scene (a model's deployment is model.scene), got "
            f"{type(scene).__name__}"
        )
    if not (np.isfinite(position_std) and position_std >= 0):
        raise ValueError(f"position_std must be finite and >= 0 (m), got {position_std!r}")
    if not axes or any(a not in (0, 1, 2) for a in axes) or len(set(axes)) != len(axes):
        raise ValueError(f"axes must be distinct coordinates among (0, 1, 2), got {axes!r}")
    k_pos, k_off = jax.random.split(key)
    m = scene.num_aps
    dtype = scene.ap_positions.dtype
    mask = jnp.zeros(3, dtype).at[jnp.asarray(axes)].set(1.0)
    noise = position_std * jax.random.normal(k_pos, (m, 3), dtype) * mask[None, :]
    offsets = (
        jax.random.uniform(k_off, (m,), dtype, minval=-jnp.pi, maxval=jnp.pi)
        if random_offsets
        else scene.ap_phase_offsets
    )
    return scene.replace(ap_positions=scene.ap_positions + noise, ap_phase_offsets=offsets)
