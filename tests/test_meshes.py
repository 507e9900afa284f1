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


@pytest.mark.parametrize(
    "text, match",
    [
        ("v 0 0\nv 1 0 0\nv 0 1 0\nf 1 2 3\n", r"m.obj:1: a vertex needs three numbers"),
        ("v 0 0 0\nv 1 0 0\nv 0 1 0\nf 1 2 x\n", r"m.obj:4: 'x' is not a vertex index"),
        ("v 0 0 a\n", r"m.obj:1: a vertex needs three numbers"),
    ],
)
def test_obj_errors_name_the_file_and_line(tmp_path, text, match):
    (tmp_path / "m.obj").write_text(text)
    with pytest.raises(ValueError, match=match):
        load_obj(tmp_path / "m.obj", frequency_hz=FREQ)


def test_a_binary_obj_is_refused_by_name(tmp_path):
    (tmp_path / "m.obj").write_bytes(b"v 0 0 0\n\xff\xfe\x00\x81 binary")
    with pytest.raises(ValueError, match="m.obj: not a text OBJ file"):
        load_obj(tmp_path / "m.obj")


def test_ply_headers_and_bodies_that_do_not_hold_are_refused(tmp_path):
    v, tris = _box_triangles((0, 0, 0), (1, 1, 1), inward=False)
    for binary in (False, True):
        _write_ply(tmp_path / "ok.ply", v, tris, binary)
        data = (tmp_path / "ok.ply").read_bytes()
        (tmp_path / "cut.ply").write_bytes(data[: len(data) - 7])
        with pytest.raises(ValueError, match="cut.ply: the file ends inside element 'face'"):
            read_ply(tmp_path / "cut.ply")
        # a comment that mentions end_header is a comment
        (tmp_path / "c.ply").write_bytes(data.replace(b"comment test", b"comment end_header x"))
        vv, polys = read_ply(tmp_path / "c.ply")
        assert_allclose(vv, v, atol=0) and len(polys) == len(tris)
    head = data[: data.index(b"end_header")]
    for old, new, match in [
        (b"element vertex 24", b"element vertex four", r"b.ply:4: expected 'element NAME COUNT'"),
        (b"property float nx", b"property half nx", r"b.ply:8: unknown PLY type 'half'"),
        (b"property double z", b"property double", r"b.ply:7: expected 'property TYPE NAME'"),
    ]:
        assert old in head
        (tmp_path / "b.ply").write_bytes(data.replace(old, new, 1))
        with pytest.raises(ValueError, match=match):
            read_ply(tmp_path / "b.ply")
    _write_ply(tmp_path / "a.ply", v, tris, False)
    text = (tmp_path / "a.ply").read_text().replace("\n3 0 1 2\n", "\n3 0 1 x\n", 1)
    (tmp_path / "a.ply").write_text(text)
    with pytest.raises(
        ValueError, match="a.ply: element 'face' holds a value that is not a number"
    ):
        read_ply(tmp_path / "a.ply")


@pytest.mark.parametrize("text", ["", "<scene><shape>", "not xml at all"])
def test_malformed_mitsuba_xml_is_refused_with_its_path(tmp_path, text):
    (tmp_path / "s.xml").write_text(text)
    with pytest.raises(ValueError, match="s.xml: not a Mitsuba XML scene"):
        load_mitsuba(tmp_path / "s.xml")


def test_a_concave_polygon_loads_as_its_own_area_with_its_normal():
    """An L-shaped floor of 3 m^2 (a fan from the first vertex covered 5 m^2, one triangle
    flipped): the triangles cover it once, every normal up."""
    from dmimo_jax.datasets.meshes import faces_from_mesh

    v = np.array([[0, 0, 0], [2, 0, 0], [2, 1, 0], [1, 1, 0], [1, 2, 0], [0, 2, 0]], float)
    order = [2, 3, 4, 5, 0, 1]  # a fan from (2, 1) covers the notch and flips a triangle
    faces = faces_from_mesh(v, [order], "wood", frequency_hz=FREQ, merge=False)

    def area(f):
        p = np.asarray(f.vertices)
        return 0.5 * np.linalg.norm(np.cross(p[1:-1] - p[0], p[2:] - p[0]).sum(0))

    assert sum(area(f) for f in faces) == pytest.approx(3.0)
    assert all(np.allclose(np.asarray(f.normal), [0, 0, 1]) for f in faces)
    merged = faces_from_mesh(v, [order], "wood", frequency_hz=FREQ)
    assert sum(area(f) for f in merged) == pytest.approx(3.0)


def test_duplicate_faces_complex_vertices_and_oversized_scenes_are_refused():
    room = box_faces(SCENE.room_size, floor="concrete", walls="concrete", frequency_hz=FREQ)
    with pytest.raises(
        ValueError, match=rf"faces\[0\] and faces\[{len(room)}\] .* the same polygon"
    ):
        MeshModel(SCENE, [*room, room[0].flipped()])
    with pytest.raises(ValueError, match="must be real coordinates"):
        dj.Face(np.eye(3) * (1 + 1j), "concrete", frequency_hz=FREQ)
    # a city block of small faces all able to block: refused with its size, not run out of memory
    tiles = [
        dj.Face([[x, y, 0.5], [x + 0.1, y, 0.5], [x + 0.1, y + 0.1, 0.5]], None, name="t")
        for x in np.arange(0.5, 8.0, 0.25)
        for y in np.arange(0.5, 8.0, 0.08)
    ]
    with pytest.raises(ValueError, match=r"a scene of \d+ faces .* needs about [\d.]+ GiB"):
        MeshModel(SCENE, [*room, *tiles])
