"""Loader for the Techtile ELLIIIT measurements (beyond the paper: real carrier phases).

The format (NetCDF3, one experiment per ``csi_EXP*.nc`` file): ``csi_real``, ``csi_imag``
(experiment, cycle, host), ``rover_x``/``rover_y``/``rover_z`` (experiment, cycle) in metres,
``hostname`` (host, 3 characters: the ceiling tile, e.g. ``A05``), ``experiment_id``,
``cycle_id``; missing values are NaN. Beside them: ``techtile_antenna_locations.yml`` (per tile,
the positions and orientations of its RF channels 0 and 1), ``techtile_room.yml`` (the room's
size and surfaces) and ``techtile_915mhz_patch.yml`` (the antennas).

Conventions. The files' phase :math:`\\arg(h)` grows with distance, :math:`+2\\pi d/\\lambda`,
which is the package's convention (every PhaseModel's mean is :math:`+2\\pi d/\\lambda`, eq. 7b
as :func:`dmimo_jax.gp.los_phase` writes it), so the loader passes it through, wrapped to
:math:`[-\\pi, \\pi)`. A snapshot (cycle) is kept when all its hosts' CSI and the rover's
three coordinates are finite; the others are dropped and counted (``num_dropped``).

The data are not the package's to ship: functions take the folder as an argument (the
examples default to ``../shared/data/techtile``).
"""

from __future__ import annotations

import dataclasses
import pathlib
import re
from typing import Any

import numpy as np

from dmimo_jax.materials import relative_permittivity
from dmimo_jax.physics import ImageSourceModel, box_room
from dmimo_jax.scene import SPEED_OF_LIGHT, Scene

TECHTILE_FREQUENCY_HZ = 920e6
"""The Techtile measurements' carrier frequency, Hz."""
_ANTENNAS = "techtile_antenna_locations.yml"
_ROOM = "techtile_room.yml"
_FILE = re.compile(r"^csi_(.+)\.nc$")


@dataclasses.dataclass(frozen=True)
class TechtileExperiment:
    """One experiment's snapshots, in the package's conventions (NumPy, float64).

    Attributes:
        experiment: its id, e.g. ``"EXP003"``.
        hosts: (M,) the tiles, in the files' column order.
        cycles: (N,) the kept snapshots' cycle ids, in the files' order (time order).
        positions: (N, 3) the rover antenna's motion-capture position, m.
        phases: (N, M) wrapped carrier phases, rad, :math:`+2\\pi d/\\lambda` convention.
        amplitudes: (N, M) CSI magnitudes (arbitrary units).
        ap_positions: (M, 3) the listed antenna positions of ``channel``, m.
        ap_orientations: (M, 3) the listed antenna orientation vectors (unit).
        channel: the RF channel of each tile the CSI comes from.
        frequency_hz: the carrier frequency.
        room_size: (3,) the room [0, Lx] x [0, Ly] x [0, Lz], m.
        materials: the room file's materials (``walls``, ``floor``, ``ceiling``).
        num_dropped: cycles dropped for a NaN CSI entry or a missing position.
        held_after_dropped: (N,) bool: the snapshot's position is bit-for-bit that of the
            file's previous cycle, which was dropped (part of :attr:`held_labels`).
    """

    experiment: str
    hosts: tuple[str, ...]
    cycles: np.ndarray
    positions: np.ndarray
    phases: np.ndarray
    amplitudes: np.ndarray
    ap_positions: np.ndarray
    ap_orientations: np.ndarray
    channel: int
    frequency_hz: float
    room_size: np.ndarray
    materials: dict[str, str]
    num_dropped: int
    held_after_dropped: np.ndarray | None = None

    @property
    def wavelength(self) -> float:
        """The carrier wavelength, m."""
        return SPEED_OF_LIGHT / self.frequency_hz

    @property
    def csi(self) -> np.ndarray:
        """(N, M) complex CSI as measured, ``amplitudes * exp(1j * phases)`` (the complex
        snapshots of :mod:`dmimo_jax.receivers`, phase convention)."""
        return self.amplitudes * np.exp(1j * self.phases)

    @property
    def held_labels(self) -> np.ndarray:
        """(N,) bool: the snapshot's position is bit-for-bit the previous snapshot's, a
        motion-capture frame held rather than measured (a live tracker's coordinates differ
        in their last digits from frame to frame, even with the rover still). The CSI of such
        a snapshot need not be where its label says: score and train with care
        (docs/real_data_measurements.md measures it on EXP002). The previous snapshot is the file's
        previous cycle, also when that cycle was dropped for a NaN CSI entry (its frame
        was still captured)."""
        held = np.concatenate([[False], np.all(np.diff(self.positions, axis=0) == 0, axis=1)])
        if self.held_after_dropped is not None:
            held = held | self.held_after_dropped
        return held

    @property
    def num_snapshots(self) -> int:
        """The number of snapshots, N."""
        return self.positions.shape[0]

    @property
    def num_aps(self) -> int:
        """The number of APs, M."""
        return len(self.hosts)


def _folder(path: Any) -> pathlib.Path:
    folder = pathlib.Path(path)
    if not folder.is_dir():
        raise ValueError(f"path must be a folder holding csi_EXP*.nc files, got {str(path)!r}")
    return folder


def list_experiments(path: Any) -> list[str]:
    """The experiment ids of the ``csi_<id>.nc`` files in ``path``, sorted."""
    return sorted(m.group(1) for f in _folder(path).iterdir() if (m := _FILE.match(f.name)))


def _yaml(file: pathlib.Path) -> Any:
    import yaml

    if not file.is_file():
        raise ValueError(f"{file.name} is missing from {str(file.parent)!r}")
    with open(file) as fh:
        return yaml.safe_load(fh)


def _strings(chars: np.ndarray) -> list[str]:
    chars = np.atleast_2d(chars)
    return [b"".join(row).decode().strip("\x00 ") for row in chars]


def _variable(nc: Any, name: str, file: pathlib.Path) -> np.ndarray:
    if name not in nc.variables:
        raise ValueError(f"{file.name} has no variable {name!r} (see the format in the loader)")
    return np.array(nc.variables[name].data)


def _antennas(folder: pathlib.Path, hosts: list[str], channel: int):
    tiles = {a["tile"]: a for a in _yaml(folder / _ANTENNAS)["antennes"]}
    missing = [h for h in hosts if h not in tiles]
    if missing:
        raise ValueError(
            f"hosts {missing} of the CSI file are not in {_ANTENNAS}: its tiles and the "
            "CSI's hostname column must match"
        )
    pos, ori = [], []
    for h in hosts:
        ch = [c for c in tiles[h]["channels"] if int(c["ch"]) == channel]
        if not ch:
            raise ValueError(f"tile {h} in {_ANTENNAS} has no channel {channel}")
        pos.append([float(ch[0][k]) for k in ("x", "y", "z")])
        ori.append([float(ch[0][k]) for k in ("vx", "vy", "vz")])
    ori = np.asarray(ori, float)
    return np.asarray(pos, float), ori / np.linalg.norm(ori, axis=1, keepdims=True)


def load_techtile(
    path: Any,
    experiment: str,
    *,
    channel: int = 1,
    frequency_hz: float = TECHTILE_FREQUENCY_HZ,
) -> TechtileExperiment:
    """Load ``csi_<experiment>.nc`` and the geometry beside it (see the module docstring).

    Args:
        path: the folder.
        experiment: the id, e.g. ``"EXP003"`` (:func:`list_experiments` lists them).
        channel: the RF channel of each tile the CSI was measured on (1 for this dataset).
        frequency_hz: the carrier (920 MHz for this dataset).

    Raises:
        ValueError: a missing folder, file, variable or tile (the message names it), or no
            snapshot with every host and a position.
    """
    from scipy.io import netcdf_file

    folder = _folder(path)
    file = folder / f"csi_{experiment}.nc"
    if not file.is_file():
        raise ValueError(
            f"experiment {experiment!r} has no file {file.name} in {str(folder)!r}; "
            f"found {list_experiments(folder)}"
        )
    if not (np.isfinite(frequency_hz) and frequency_hz > 0):
        raise ValueError(f"frequency_hz must be positive, got {frequency_hz!r}")
    try:
        with netcdf_file(file, "r", mmap=False) as nc:
            hosts = _strings(_variable(nc, "hostname", file))
            real = np.asarray(_variable(nc, "csi_real", file), np.float64)
            imag = np.asarray(_variable(nc, "csi_imag", file), np.float64)
            xyz = np.stack(
                [np.asarray(_variable(nc, f"rover_{a}", file), np.float64) for a in "xyz"], -1
            )
            cycles = np.asarray(_variable(nc, "cycle_id", file))
    except (OSError, TypeError, IndexError, EOFError, ValueError) as err:
        if isinstance(err, ValueError) and str(err).startswith(file.name):
            raise
        raise ValueError(f"{file.name} cannot be read (truncated or corrupt?): {err}") from err
    if real.shape != imag.shape:
        raise ValueError(
            f"{file.name}: csi_real {real.shape} and csi_imag {imag.shape} must have the same shape"
        )
    if real.shape[-1] != len(hosts):
        raise ValueError(
            f"{file.name}: csi has {real.shape[-1]} host columns but hostname lists "
            f"{len(hosts)} hosts"
        )
    twice = sorted({h for h in hosts if hosts.count(h) > 1})
    if twice:
        raise ValueError(
            f"{file.name}: hostname lists {twice} more than once (two columns at one tile)"
        )
    csi = real + 1j * imag
    csi, xyz = csi.reshape(-1, len(hosts)), xyz.reshape(-1, 3)
    if csi.shape[0] != xyz.shape[0] or cycles.shape[0] != xyz.shape[0]:
        raise ValueError(f"{file.name}: csi, rover positions and cycle_id disagree in length")
    keep = np.all(np.isfinite(csi), axis=1) & np.all(np.isfinite(xyz), axis=1)
    if not keep.any():
        raise ValueError(f"{file.name} has no snapshot with every host's CSI and a position")
    ap, ori = _antennas(folder, hosts, channel)
    room = _yaml(folder / _ROOM)["room"]
    dims = room["dimensions"]
    size = np.array([dims["length_x_m"], dims["width_y_m"], dims["height_z_m"]], float)
    return TechtileExperiment(
        experiment=experiment,
        hosts=tuple(hosts),
        cycles=cycles[keep],
        positions=xyz[keep].astype(float),
        phases=np.angle(csi[keep]),
        amplitudes=np.abs(csi[keep]),
        ap_positions=ap,
        ap_orientations=ori,
        channel=channel,
        frequency_hz=float(frequency_hz),
        room_size=size,
        materials={k: str(v) for k, v in room.get("materials", {}).items()},
        num_dropped=int((~keep).sum()),
        held_after_dropped=(
            np.concatenate([[False], np.all(np.diff(xyz, axis=0) == 0, axis=1) & ~keep[:-1]])
        )[keep],
    )


def techtile_scene(
    data: TechtileExperiment,
    *,
    ue_low: Any = None,
    ue_high: Any = None,
    ap_phase_offsets: Any = None,
    phase_noise_std: float = 0.05,
) -> Scene:
    """A :class:`Scene` of the experiment's antennas, carrier and room (float64).

    The UE region defaults to the bounding box of the experiment's positions. The powers are
    set so that eq. (9) gives ``phase_noise_std`` (rad) at the median antenna distance of the
    positions (0.05 rad is the repeatability measured on a still rover); the floor is wood.
    """
    x = data.positions
    low = x.min(axis=0) if ue_low is None else np.asarray(ue_low, float)
    high = x.max(axis=0) if ue_high is None else np.asarray(ue_high, float)
    if not (np.isfinite(phase_noise_std) and phase_noise_std > 0):
        raise ValueError(f"phase_noise_std must be positive (rad), got {phase_noise_std!r}")
    d = np.median(np.linalg.norm(x[:, None, :] - data.ap_positions[None], axis=-1))
    alpha = data.wavelength / (4 * np.pi * d)
    # eq. (9): var = sigma_w^2 / (2 P alpha^2)  =>  sigma_w^2 = 2 P alpha^2 std^2, with P = 1 W
    noise_power = 2.0 * alpha**2 * phase_noise_std**2
    return Scene(
        ap_positions=data.ap_positions,
        wavelength=data.wavelength,
        eps_r=complex(relative_permittivity("wood", data.frequency_hz)),
        tx_power=1.0,
        noise_power=noise_power,
        ue_low=low,
        ue_high=high,
        room_size=data.room_size,
        ap_phase_offsets=ap_phase_offsets,
        dtype=np.float64,
    )


def techtile_room_model(scene: Scene, *, walls: str = "plywood", floor: str = "wood") -> Any:
    """The nominal room: floor and four walls of the room file's materials (ITU-R P.2040).

    The ceiling is left out: the antennas are mounted in it, facing down, so no path leaves
    them upward. ``walls``/``floor`` take any ITU material name or a complex permittivity.
    """
    reflectors = box_room(
        np.asarray(scene.room_size),
        floor=floor,
        walls=walls,
        frequency_hz=float(scene.frequency),
        dtype=np.float64,
    )
    return ImageSourceModel(scene, reflectors)
