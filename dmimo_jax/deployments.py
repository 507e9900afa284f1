r"""Scenes from what a deployment states: a plan's APs, carrier, UE region and link budget
(:func:`deployment_scene`), a scene file (:func:`load_scene`), and the paper's deployment
(:func:`paper_scene`, :func:`paper_scene_data`)."""

from __future__ import annotations

import json
import pathlib
from importlib import resources
from typing import Any

import numpy as np
from jax.typing import ArrayLike

from dmimo_jax._checks import check_positions
from dmimo_jax.antenna import AntennaPattern
from dmimo_jax.materials import Convention, is_perfect_conductor, relative_permittivity
from dmimo_jax.scene import (
    SPEED_OF_LIGHT,
    Polarization,
    Scene,
    dbm_to_watt,
    thermal_noise_power,
)

__all__ = ["paper_scene_data"]  # the others live at the top of the package (dj.load_scene, ...)


def paper_scene_data() -> dict[str, Any]:
    """The paper's deployment as shipped in ``dmimo_jax/data/paper_scene.json``."""
    text = resources.files("dmimo_jax").joinpath("data/paper_scene.json").read_text()
    return json.loads(text)


def deployment_scene(
    ap_positions: ArrayLike,
    *,
    frequency_hz: float,
    ue_low: ArrayLike,
    ue_high: ArrayLike,
    room_size: ArrayLike | None = None,
    power_dbm: float = -10.0,
    bandwidth_hz: float = 180e3,
    noise_figure_db: float = 3.0,
    temperature_k: float = 290.0,
    ground: str | complex = "concrete",
    convention: Convention = "itu",
    polarization: Polarization = "TE",
    antenna: AntennaPattern | None = None,
    dtype: Any = None,
) -> Scene:
    r"""A :class:`Scene` from what a deployment's plan states: the APs, the carrier, the UE
    region and the link budget (the noise :math:`k_B T W \cdot NF` from
    :func:`thermal_noise_power`).

    Args:
        ap_positions: (M, 3) the APs' phase centres, m, above the ground (z > 0).
        frequency_hz: the carrier frequency, Hz.
        ue_low: (3,) the UE region's low corner, m.
        ue_high: (3,) its high corner, m.
        room_size: (3,) the room [0, Lx] x [0, Ly] x [0, Lz], m (default: the box from the
            origin to the highest corner of the APs and the UE region).
        power_dbm: the UE's transmit power, dBm.
        bandwidth_hz: the pilot's bandwidth W, Hz.
        noise_figure_db: the receivers' noise figure, dB.
        temperature_k: the noise temperature T, K.
        ground: the ground's material (an ITU-R P.2040 name of :mod:`dmimo_jax.materials`,
            ``"metal"`` a perfect conductor) or its complex relative permittivity.
        convention: how a material name's permittivity is evaluated: ``"itu"`` (correct) or
            ``"paper"`` (the paper's, f in GHz where ITU-R P.2040 asks for Hz).
        polarization: ``"TE"`` or ``"TM"``.
        antenna: the APs' field pattern (default isotropic).
        dtype: float dtype of the leaves (default: JAX's default float).

    Raises:
        ValueError: a frequency, bandwidth or temperature that is not a positive number, and
            everything :class:`Scene` refuses (naming it).

    Examples:
        >>> aps = [[2.0, 2.0, 3.0], [8.0, 2.0, 3.0], [5.0, 8.0, 3.0], [5.0, 5.0, 3.0]]
        >>> scene = deployment_scene(aps, frequency_hz=3.5e9, ue_low=[1, 1, 0.5], ue_high=[9, 9, 2])
        >>> scene.num_aps, round(float(scene.wavelength), 4), scene.room_size.tolist()
        (4, 0.0857, [9.0, 9.0, 3.0])
    """
    for name, value in (
        ("frequency_hz", frequency_hz),
        ("bandwidth_hz", bandwidth_hz),
        ("temperature_k", temperature_k),
    ):
        if isinstance(value, bool | str) or not np.isfinite(value) or not float(value) > 0:
            raise ValueError(f"{name} must be a positive number, got {value!r}")
    f = float(frequency_hz)
    check_positions("ap_positions", ap_positions, batched=True)
    check_positions("ue_high", ue_high, batched=False)
    if room_size is None:
        highest = np.max(np.vstack([np.asarray(ap_positions, float), [ue_high]]), axis=0)
        room_size = np.maximum(highest, 0.0)
    noise = thermal_noise_power(
        float(bandwidth_hz), temperature_k=float(temperature_k), noise_figure_db=noise_figure_db
    )
    metal = isinstance(ground, str) and is_perfect_conductor(ground)
    if isinstance(ground, str):
        eps = relative_permittivity(ground, f, convention=convention)
    else:
        eps = ground
    return Scene(
        ap_positions=ap_positions,
        wavelength=SPEED_OF_LIGHT / f,
        eps_r=eps,
        tx_power=float(dbm_to_watt(power_dbm)),
        noise_power=noise,
        ue_low=ue_low,
        ue_high=ue_high,
        room_size=room_size,
        antenna=antenna,
        polarization=polarization,
        perfect_conductor=metal,
        dtype=dtype,
    )


def load_scene(
    path: Any,
    power_dbm: float = -10.0,
    material: str = "concrete",
    *,
    convention: Convention = "itu",
    polarization: Polarization = "TE",
    dtype: Any = None,
) -> Scene:
    """A :class:`Scene` from a scene file: JSON with ``"aps"`` ((M, 3) m),
    ``"carrier_frequency_hz"``, ``"bandwidth_hz"``, ``"ue_region": {"low", "high"}`` and
    optionally ``"room": {"size"}``, ``"noise_temperature_k"`` and ``"noise_figure_db"``
    (the format of the paper's scene, :func:`paper_scene_data`); the rest as
    :func:`deployment_scene`'s.

    Raises:
        ValueError: a file that is not such JSON (naming the key that is missing).
    """
    try:
        data = json.loads(pathlib.Path(path).read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"path: cannot read a JSON scene file at {str(path)!r}: {err}") from err
    return _scene_of(data, power_dbm, material, convention, polarization, dtype, str(path))


def _scene_of(data, power_dbm, material, convention, polarization, dtype, where) -> Scene:
    missing = [
        k for k in ("aps", "carrier_frequency_hz", "bandwidth_hz", "ue_region") if k not in data
    ]
    if missing or not isinstance(data.get("ue_region"), dict):
        raise ValueError(
            f"{where}: a scene file needs 'aps', 'carrier_frequency_hz', 'bandwidth_hz' and "
            f"'ue_region' ({{'low': [...], 'high': [...]}}); missing {missing or ['ue_region.low/high']}"
        )
    room = data.get("room", {}).get("size")
    return deployment_scene(
        np.asarray(data["aps"], float),
        frequency_hz=float(data["carrier_frequency_hz"]),
        ue_low=data["ue_region"]["low"],
        ue_high=data["ue_region"]["high"],
        room_size=room,
        power_dbm=power_dbm,
        bandwidth_hz=float(data["bandwidth_hz"]),
        noise_figure_db=float(data.get("noise_figure_db", 3.0)),
        temperature_k=float(data.get("noise_temperature_k", 290.0)),
        ground=material,
        convention=convention,
        polarization=polarization,
        dtype=dtype,
    )


def paper_scene(
    power_dbm: float = -10.0,
    material: str = "concrete",
    *,
    convention: Convention = "paper",
    polarization: Polarization = "TE",
    dtype: Any = None,
) -> Scene:
    r"""The set-up of the paper's numerical results (Sec. VI).

    f_c = 800 MHz, :math:`\lambda = c/f_c`, W = 180 kHz, T = 290 K, NF = 3 dB,
    :math:`k_B = 1.38\times10^{-23}` J/K, the 17 APs of the paper's layout on the
    4 m ceiling of a 10 x 10 x 4 m room, UE region [0.5, 9.5]^2 x [0.5, 3.5] m.
    ``convention="paper"`` gives concrete :math:`\varepsilon_r = 5.24 - j0.0096` as the
    paper states; pass ``convention="itu"`` for the correct ITU-R value (5.24 - j0.872).

    Args:
        power_dbm: transmit power P in dBm.
        material: ground material (see :mod:`dmimo_jax.materials`); ``metal`` is a perfect conductor.
        convention: ``"paper"`` (default here) or ``"itu"``.
        polarization: ``"TE"`` (paper) or ``"TM"``.
        dtype: float dtype of the leaves (default: JAX's default float).

    Examples:
        >>> scene = paper_scene()
        >>> scene.num_aps, round(float(scene.wavelength), 6)
        (17, 0.374741)
    """
    return _scene_of(
        paper_scene_data(), power_dbm, material, convention, polarization, dtype, "paper_scene"
    )
