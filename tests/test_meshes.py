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
    from dmimo_jax.datasets.polygons import faces_from_mesh

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


# ----------------------------------------------------------- orientation from connectivity


def _write_mesh_obj(path, parts):
    """An OBJ of named polygon lists (each a list of (K, 3) vertex arrays), written as the
    exporter would: every polygon's vertices as they are, vertices shared by position."""
    lines, count = [], 0
    for name, polys in parts:
        lines.append(f"o {name}\nusemtl {name}")
        for p in polys:
            lines += [f"v {a:.17g} {b:.17g} {c:.17g}" for a, b, c in np.asarray(p, float)]
            lines.append("f " + " ".join(str(count + 1 + k) for k in range(len(p))))
            count += len(p)
    path.write_text("\n".join(lines) + "\n")


def _quads(low, high, outward=True):
    return [
        np.asarray(f.vertices) for f in cuboid_faces(low, high, 4.0, name="b", inward=not outward)
    ]


def test_a_box_exported_with_normals_out_is_a_room_around_its_aps(tmp_path):
    """The usual export of a room (a closed box, normals out of it): loaded as the room of
    faces (normals in), the same phases as ``box_faces``; with a UE inside it no error."""
    _write_mesh_obj(tmp_path / "room.obj", [("concrete", _quads((0, 0, 0), (10, 10, 4)))])
    ref = box_faces(
        SCENE.room_size, floor="concrete", ceiling="concrete", walls="concrete", frequency_hz=FREQ
    )
    xs = dj.sample_positions(jax.random.key(1), 8, SCENE)
    want = jax.vmap(MeshModel(SCENE, ref).mean)(xs)
    for air in (None, SCENE.ap_positions, [[5.0, 5.0, 2.0]]):
        faces = load_obj(tmp_path / "room.obj", frequency_hz=FREQ, air=air)
        normals = {tuple(np.asarray(f.normal)) for f in faces}
        assert normals == {tuple(np.asarray(f.normal)) for f in ref}  # every one into the room
        model = MeshModel(SCENE, faces)
        model.check_domain("xs", xs)
        assert_allclose(jax.vmap(model.mean)(xs), want, rtol=0, atol=1e-12)
    # trusting the file, the room is a solid around its UEs
    faces = load_obj(tmp_path / "room.obj", frequency_hz=FREQ, orient=False)
    with pytest.raises(ValueError, match="inside a solid"):
        MeshModel(SCENE, faces).check_domain("xs", xs)
    # air points outside the box make it a solid (normals out), whatever the file says
    inverted = [q[::-1] for q in _quads((0, 0, 0), (1, 1, 1))]
    _write_mesh_obj(tmp_path / "cube.obj", [("wood", inverted)])
    cube = load_obj(tmp_path / "cube.obj", frequency_hz=FREQ, air=[[3.0, 3.0, 3.0]])
    assert {tuple(np.asarray(f.normal)) for f in cube} == {
        tuple(np.asarray(f.normal)) for f in cuboid_faces((0, 0, 0), (1, 1, 1), 4.0, name="b")
    }


def test_a_ground_plane_upside_down_and_buildings_with_mixed_normals():
    """A street: a ground quad whose normal points down (open: a sheet) and two closed
    buildings of triangles, some of them reversed: the inside-a-solid check agrees with the
    orientation-free count (an upward ray's crossings) at every one of 400 points."""
    from dmimo_jax.datasets import scene_faces

    rng = np.random.default_rng(0)
    ground = np.array([[-20, -20, 0], [-20, 20, 0], [20, 20, 0], [20, -20, 0]], float)  # down
    buildings = [((-15, -10, 0), (-5, 10, 12)), ((4, -12, 0), (12, 6, 20))]
    meshes = [("concrete", [ground])]
    for low, high in buildings:
        tris = [t for q in _quads(low, high) for t in (q[[0, 1, 2]], q[[0, 2, 3]])]
        meshes.append(("brick", [t[::-1] if rng.random() < 0.5 else t for t in tris]))
    faces = scene_faces(meshes, frequency_hz=FREQ)
    assert [f.sheet for f in faces].count(True) == 1 and faces[0].sheet
    aps = np.array([[0.0, -15.0, 6.0], [0.0, 15.0, 6.0], [16.0, 10.0, 8.0], [-18.0, 15.0, 5.0]])
    scene = dj.Scene(ap_positions=aps, wavelength=0.375, eps_r=5.24 - 0.87j, tx_power=1e-4,
                     noise_power=1e-13, ue_low=[-19, -19, 0.5], ue_high=[19, 19, 2.0])  # fmt: skip
    model = MeshModel(scene, faces)
    pts = np.c_[rng.uniform(-19.5, 19.5, (400, 2)), np.full(400, 1.5)]
    inside = np.zeros(400, bool)
    for low, high in buildings:
        inside |= np.all((pts > np.asarray(low)) & (pts < np.asarray(high)), axis=1)
    assert 0.1 < inside.mean() < 0.9
    np.testing.assert_array_equal(model.in_air(pts), ~inside)
    with pytest.raises(ValueError, match="inside a solid.*'brick'"):
        model.check_domain("x", pts[inside][0])
    assert np.all(np.isfinite(jax.vmap(model.mean)(jnp.asarray(pts[~inside][:8]))))
    # trusting the files' normals, the ground and the reversed triangles decide wrongly
    trusted = scene_faces(meshes, frequency_hz=FREQ, orient=False)
    probe = dj.Scene(ap_positions=aps[:1], wavelength=0.375, eps_r=5.24 - 0.87j, tx_power=1e-4,
                     noise_power=1e-13, ue_low=[-19, -19, 0.5], ue_high=[19, 19, 2.0])  # fmt: skip
    try:
        agree = np.mean(MeshModel(probe, trusted).in_air(pts) == ~inside)
    except ValueError:  # the AP itself counted inside a solid
        agree = 0.0
    assert agree < 1.0


def test_float32_city_coordinates_load_where_merged_polygons_are_not_planar(tmp_path):
    """A float32 PLY far from the origin (a city's coordinates, 61 um between neighbouring
    float32 values): a near-planar quad with a corner one or two float32 steps off the
    others' plane is split into its two triangles, and two coplanar-looking triangles whose
    union is not planar to 1 um stay two triangles."""
    base = np.array([512.25, -731.5, 0.0])
    quad = base + np.array([[0, 0, 0], [7.3, 0, 0], [7.3, 0.0, 11.1], [0, 6.2e-5, 11.1]])
    tri_a = base + np.array([[20, 0, 0], [27, 0, 0], [27, 0, 9]])
    tri_b = base + np.array([[20, 0, 0], [27, 0, 9], [20, 1.2e-4, 9]])
    v = np.concatenate([quad, tri_a, tri_b]).astype(np.float32)
    head = (
        f"ply\nformat binary_little_endian 1.0\nelement vertex {len(v)}\nproperty float x\n"
        "property float y\nproperty float z\nelement face 3\n"
        "property list uchar int vertex_indices\nend_header\n"
    )
    body = v.tobytes() + struct.pack("<B4i", 4, 0, 1, 2, 3)
    body += struct.pack("<B3i", 3, 4, 5, 6) + struct.pack("<B3i", 3, 7, 8, 9)
    (tmp_path / "m.ply").write_bytes(head.encode() + body)
    (tmp_path / "s.xml").write_text(
        '<scene><bsdf type="itu-radio-material" id="m"><string name="type" value="marble"/>'
        '</bsdf><shape type="ply"><string name="filename" value="m.ply"/><ref id="m"/></shape>'
        "</scene>"
    )
    faces = load_mitsuba(tmp_path / "s.xml", frequency_hz=FREQ)
    assert [f.num_vertices for f in faces] == [3, 3, 3, 3]
    assert all(f.sheet for f in faces)  # open surfaces
    area = sum(
        0.5 * np.linalg.norm(np.cross(*(np.asarray(f.vertices)[1:] - np.asarray(f.vertices)[0])))
        for f in faces
    )
    assert area == pytest.approx(7.3 * 11.1 + 7 * 9, rel=1e-6)


def test_a_polygon_a_mesh_holds_twice_loads_once(tmp_path):
    wall = np.array([[0, 0, 0], [4, 0, 0], [4, 0, 3], [0, 0, 3]], float)
    _write_mesh_obj(tmp_path / "w.obj", [("glass", [wall, wall[::-1], wall + [0, 2, 0]])])
    faces = load_obj(tmp_path / "w.obj", frequency_hz=FREQ)
    assert len(faces) == 2 and all(f.sheet for f in faces)


def test_a_sheet_bounds_no_solid():
    """A plate whose normal points away from a UE is met from behind by the inside check's
    rays: as a sheet the UE is in the air."""
    room = box_faces(SCENE.room_size, floor="concrete", walls="concrete", frequency_hz=FREQ)
    plate = [[3, 2, 0.5], [3, 8, 0.5], [3, 8, 3.5], [3, 2, 3.5]]  # normal +x, x behind it
    x = jnp.array([2.5, 5.0, 1.0])
    for sheet in (False, True):
        model = MeshModel(SCENE, [*room, dj.Face(plate, "glass", name="plate",
                                                  frequency_hz=FREQ, sheet=sheet)])  # fmt: skip
        assert bool(model.in_air(x[None])[0]) == sheet
    assert "sheet" in repr(dj.Face(plate, "glass", frequency_hz=FREQ, sheet=True))
    with pytest.raises(ValueError, match="sheet must be True or False"):
        dj.Face(plate, "glass", frequency_hz=FREQ, sheet="yes")


def _sheets(faces):
    return sorted({(f.name, bool(f.sheet)) for f in faces})


@pytest.mark.parametrize(
    "second",
    [
        ((0.0, 0.0, 1.0), (1.0, 1.0, 2.0)),  # stacked: they share a whole face
        ((1.0, 0.0, 0.0), (2.0, 1.0, 1.0)),  # side by side: a shared face
        ((1.0, 1.0, 0.0), (2.0, 2.0, 1.0)),  # diagonal: one shared edge
    ],
)
def test_touching_solids_load_as_solids_not_sheets(tmp_path, second):
    """Two closed boxes (two objects, two materials) touching along a face or an edge: each
    is a solid (its faces no sheets, normals out of it), as it is alone."""
    a = _box_triangles((0.0, 0.0, 0.0), (1.0, 1.0, 1.0), inward=False)
    b = _box_triangles(*second, inward=False)
    path = tmp_path / "cabinets.obj"
    _write_obj(path, {"concrete": a, "wood": b})
    faces = load_obj(path, frequency_hz=FREQ, air=[[5.0, 5.0, 2.0]])
    assert _sheets(faces) == [("concrete", False), ("wood", False)]
    for f in faces:  # every normal points out of its own box
        low, high = ((0.0, 0.0, 0.0), (1.0, 1.0, 1.0)) if f.name == "concrete" else second
        centre = (np.asarray(low) + np.asarray(high)) / 2
        assert float(np.dot(np.asarray(f.vertices).mean(0) - centre, f.normal)) > 0


def test_a_millimetre_box_beside_a_large_ground_keeps_its_shape(tmp_path):
    """The vertex merge is absolute (MERGE_TOLERANCE), not a fraction of the scene: a 1 mm
    box next to a 20 km ground is a closed solid of six faces."""
    box = _box_triangles((0.0, 0.0, 0.0), (1e-3, 1e-3, 1e-3), inward=False)
    ground = (np.array([[-1e4, -1e4, -1.0], [1e4, -1e4, -1.0], [1e4, 1e4, -1.0], [-1e4, 1e4, -1.0]]),
              [[0, 1, 2], [0, 2, 3]])  # fmt: skip
    path = tmp_path / "tiny.obj"
    _write_obj(path, {"metal": box, "concrete": ground})
    faces = load_obj(path, frequency_hz=FREQ)
    mine = [f for f in faces if f.name == "metal"]
    assert len(mine) == 6 and not any(f.sheet for f in mine)


def test_scene_file_probes_are_refused_or_warned_by_name(tmp_path):
    """A NaN vertex, air and orient that are not what they say, and a zero-area triangle
    (skipped with a warning naming the file and the face)."""
    from dmimo_jax.datasets.polygons import orient_polygons

    v, tris = _box_triangles((0.0, 0.0, 0.0), (1.0, 1.0, 1.0), inward=False)
    path = tmp_path / "box.obj"
    _write_obj(path, {"concrete": (v, tris)})
    for bad in ("ap", [[1.0, 2.0]], [[np.nan, 0.0, 0.0]]):
        with pytest.raises(ValueError, match="air"):
            load_obj(path, frequency_hz=FREQ, air=bad)
    with pytest.raises(ValueError, match="orient"):
        load_obj(path, frequency_hz=FREQ, orient="yes")
    polys = [v[t] for t in tris]
    with pytest.raises(ValueError, match="air"):
        orient_polygons(polys, air="inside")
    nan = [p.copy() for p in polys]
    nan[0][0, 0] = np.nan
    with pytest.raises(ValueError, match="not finite"):
        orient_polygons(nan)
    nan_path = tmp_path / "nan.obj"
    nan_path.write_text(path.read_text().replace("v 0.0 0.0 0.0", "v nan 0.0 0.0", 1))
    with pytest.raises(ValueError, match="nan.obj:.*finite"):
        load_obj(nan_path, frequency_hz=FREQ)
    flat = tmp_path / "flat.obj"
    flat.write_text(path.read_text() + "f 1 1 2\n")  # one extra face of zero area
    with pytest.warns(UserWarning, match=r"flat\.obj.*face 12.*zero area"):
        faces = load_obj(flat, frequency_hz=FREQ)
    assert len(faces) == 6 and not any(f.sheet for f in faces)
