"""dmimo_jax.datasets.meshes: OBJ, PLY and Mitsuba XML scenes into faces, on files the tests
write (a box room as triangles loads as the box of faces)."""

import struct

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dmimo_jax as dj
from dmimo_jax.datasets import load_mitsuba, load_obj, read_ply
from dmimo_jax.physics import MeshModel, box_faces, cuboid_faces
from tests.helpers import assert_allclose

SCENE = dj.paper_scene(convention="itu")
FREQ = float(SCENE.frequency)


def _box_triangles(low, high, inward):
    """The 12 triangles (vertex array, index triples) of a box, normals in or out."""
    faces = cuboid_faces(low, high, 4.0, name="b", inward=inward)
    verts, tris = [], []
    for f in faces:
        v = np.asarray(f.vertices)
        base = len(verts)
        verts.extend(v.tolist())
        tris += [[base, base + 1, base + 2], [base, base + 2, base + 3]]
    return np.array(verts), tris


def _write_obj(path, parts):
    lines, offset = [], 0
    for name, (v, tris) in parts.items():
        lines.append(f"o {name}\nusemtl {name}")
        lines += [f"v {a} {b} {c}" for a, b, c in v]
        lines += [
            f"f {t[0] + 1 + offset}/1/1 {t[1] + 1 + offset} {t[2] + 1 + offset}" for t in tris
        ]
        offset += len(v)
    path.write_text("\n".join(lines) + "\n")


def _write_ply(path, v, tris, binary):
    head = (
        f"ply\nformat {'binary_little_endian' if binary else 'ascii'} 1.0\ncomment test\n"
        f"element vertex {len(v)}\nproperty double x\nproperty double y\nproperty double z\n"
        f"property float nx\nelement face {len(tris)}\nproperty list uchar int vertex_indices\n"
        "end_header\n"
    )
    if binary:
        body = b"".join(struct.pack("<3df", *p, 0.0) for p in v)
        body += b"".join(struct.pack("<B3i", 3, *t) for t in tris)
        path.write_bytes(head.encode() + body)
    else:
        rows = [f"{a} {b} {c} 0" for a, b, c in v] + [f"3 {t[0]} {t[1]} {t[2]}" for t in tris]
        path.write_text(head + "\n".join(rows) + "\n")


def test_an_obj_box_room_of_triangles_is_the_box_of_faces(tmp_path):
    v, tris = _box_triangles((0, 0, 0), (10, 10, 4), inward=True)
    _write_obj(tmp_path / "room.obj", {"itu_concrete": (v, tris)})
    faces = load_obj(tmp_path / "room.obj", frequency_hz=FREQ)
    assert len(faces) == 6 and {f.num_vertices for f in faces} == {4}  # triangles merged
    assert {f.name for f in faces} == {"itu_concrete"}
    ref = box_faces(
        SCENE.room_size, floor="concrete", ceiling="concrete", walls="concrete", frequency_hz=FREQ
    )
    xs = dj.sample_positions(jax.random.key(0), 16, SCENE)
    got = jax.vmap(MeshModel(SCENE, faces).mean)(xs)
    assert_allclose(got, jax.vmap(MeshModel(SCENE, ref).mean)(xs), rtol=0, atol=1e-12)
    # unmerged, the 12 triangles give the same phases away from the diagonals
    tri = load_obj(tmp_path / "room.obj", frequency_hz=FREQ, merge=False)
    assert len(tri) == 12
    assert_allclose(jax.vmap(MeshModel(SCENE, tri).mean)(xs), got, rtol=0, atol=1e-12)


@pytest.mark.parametrize("binary", [False, True])
def test_a_mitsuba_scene_with_ply_meshes_and_materials(tmp_path, binary):
    room_v, room_t = _box_triangles((0, 0, 0), (10, 10, 4), inward=True)
    pil_v, pil_t = _box_triangles((5.7, 4.2, 0.0), (6.3, 4.8, 4.0), inward=False)
    (tmp_path / "meshes").mkdir()
    _write_ply(tmp_path / "meshes" / "room.ply", room_v, room_t, binary)
    _write_ply(tmp_path / "meshes" / "pillar.ply", pil_v, pil_t, binary)
    (tmp_path / "scene.xml").write_text(
        """<scene version="2.1.0">
  <bsdf type="itu-radio-material" id="mat-room"><string name="type" value="brick"/></bsdf>
  <bsdf type="twosided" id="mat-itu_metal"><bsdf type="diffuse"/></bsdf>
  <shape type="ply" id="mesh-room">
    <string name="filename" value="meshes/room.ply"/><ref id="mat-room" name="bsdf"/>
  </shape>
  <shape type="ply" id="mesh-pillar">
    <string name="filename" value="meshes/pillar.ply"/><ref id="mat-itu_metal"/>
  </shape>
</scene>"""
    )
    faces = load_mitsuba(tmp_path / "scene.xml", frequency_hz=FREQ)
    names = [f.name for f in faces]
    assert names.count("brick") == 6 and names.count("mat-itu_metal") == 6
    assert all(f.perfect_conductor for f in faces if f.name == "mat-itu_metal")
    ref = box_faces(
        SCENE.room_size, floor="brick", ceiling="brick", walls="brick", frequency_hz=FREQ
    ) + cuboid_faces((5.7, 4.2, 0.0), (6.3, 4.8, 4.0), None, name="pillar")
    xs = jnp.array([[2.0, 2.0, 1.0], [8.0, 7.0, 2.5], [6.0, 8.0, 1.5]])
    got = jax.vmap(MeshModel(SCENE, faces).mean)(xs)
    assert_allclose(got, jax.vmap(MeshModel(SCENE, ref).mean)(xs), rtol=0, atol=1e-9)
    # the pillar is a solid: a UE inside it is refused
    with pytest.raises(ValueError, match="inside a solid"):
        MeshModel(SCENE, faces).mean(jnp.array([6.0, 4.5, 1.0]))
    # materials= overrides a name
    over = load_mitsuba(tmp_path / "scene.xml", frequency_hz=FREQ, materials={"brick": 3 - 0.1j})
    assert complex(over[0].eps_r) == 3 - 0.1j


def test_loaders_refuse_bad_files(tmp_path):
    (tmp_path / "bad.obj").write_text("v 0 0 0\nv 1 0 0\nf 1 2 5\n")
    with pytest.raises(ValueError, match="out of range"):
        load_obj(tmp_path / "bad.obj")
    (tmp_path / "x.obj").write_text("usemtl mystery\nv 0 0 0\nv 1 0 0\nv 0 1 0\nf 1 2 3\n")
    with pytest.raises(ValueError, match="no material for 'mystery'"):
        load_obj(tmp_path / "x.obj")
    (tmp_path / "nan.obj").write_text("usemtl wood\nv 0 0 nan\nv 1 0 0\nv 0 1 0\nf 1 2 3\n")
    with pytest.raises(ValueError, match="finite"):
        load_obj(tmp_path / "nan.obj", frequency_hz=FREQ)
    (tmp_path / "x.ply").write_text("not a ply")
    with pytest.raises(ValueError, match="not a PLY"):
        read_ply(tmp_path / "x.ply")
    (tmp_path / "t.xml").write_text(
        '<scene><shape type="ply"><string name="filename" value="a.ply"/>'
        '<transform name="to_world"/></shape></scene>'
    )
    with pytest.raises(ValueError, match="transform"):
        load_mitsuba(tmp_path / "t.xml")
