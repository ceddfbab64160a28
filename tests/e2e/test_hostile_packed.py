"""Packed-filter files edited by a hostile hand: refused with PackedFormatError, never run.

Each case was a silent wrong result, a huge allocation or a foreign exception
before the checksum covered the metadata and the loader checked every field
(issue 23).
"""

import io
import json
import zipfile

import numpy as np
import pytest

from conftest import resign_packed_metadata

import cso
from cso.packed_file import PackedFormatError

PARAMS = dict(stride=(1, 2), padding=((1, 0), (2, 1)), groups=2)


@pytest.fixture
def layer(rng):
    x = rng.standard_normal((2, 8, 11, 12)).astype(np.float32)
    w = rng.standard_normal((20, 4, 3, 3)).astype(np.float32)
    b = rng.standard_normal(20).astype(np.float32)
    return x, w, b


@pytest.fixture
def saved(tmp_path, layer):
    x, w, b = layer
    path = tmp_path / "packed.npz"
    cso.save_packed(path, {"conv": cso.pack_filters(w, x.shape, bias=b, **PARAMS)})
    return path


def read_members(path) -> dict:
    with np.load(path, allow_pickle=False) as archive:
        return {name: archive[name] for name in archive.files}


def metadata_of(members) -> dict:
    return json.loads(members["__metadata__"].tobytes().decode())


def write(path, members, metadata=None, raw_metadata=None) -> None:
    members = dict(members)
    if raw_metadata is None:
        raw_metadata = json.dumps(metadata).encode()
    members["__metadata__"] = np.frombuffer(raw_metadata, np.uint8)
    np.savez(path, **members)


def edit_plan(path, field, value, *, resigned):
    members = read_members(path)
    metadata = metadata_of(members)
    metadata["layers"]["conv"]["plan"][field] = value
    if resigned:
        resign_packed_metadata(metadata, members)
    write(path, members, metadata)


HOSTILE_PLAN_FIELDS = [
    ("window_parts", 0),
    ("window_parts", -1),
    ("channel_tile", -5),
    ("channel_tile", 0),
    ("channel_tile", 10**6),
    ("vector_operand", "reduction"),
    ("l2_tiles", 0),
    ("l3_tiles", 0),
    ("vector_lanes", 0),
    ("windows_per_tile", 16000),
    ("threads", 10**6),
    ("dtype", "float16"),
    ("schedule", "XS"),
]


@pytest.mark.parametrize("field, value", HOSTILE_PLAN_FIELDS)
def test_an_edited_plan_fails_the_checksum(saved, field, value):
    edit_plan(saved, field, value, resigned=False)
    with pytest.raises(PackedFormatError):
        cso.load_packed(saved)


@pytest.mark.parametrize("field, value", HOSTILE_PLAN_FIELDS)
def test_an_edited_plan_with_its_checksum_recomputed_is_refused_field_by_field(
    saved, field, value
):
    edit_plan(saved, field, value, resigned=True)
    with pytest.raises(PackedFormatError, match="(?i)" + field.split("_")[0]):
        cso.load_packed(saved)


def test_an_edit_that_leaves_a_runnable_plan_still_fails_the_checksum(saved):
    members = read_members(saved)
    plan = metadata_of(members)["layers"]["conv"]["plan"]
    assert plan["channel_tile"] > 1 or plan["l3_tiles"] >= 1
    edit_plan(saved, "l3_tiles", 1 if plan["l3_tiles"] != 1 else 2, resigned=False)
    with pytest.raises(PackedFormatError, match="checksum"):
        cso.load_packed(saved)


@pytest.mark.parametrize(
    "field, value",
    [("groups", 0), ("stride", [0, 1]), ("padding", [1e400, 0, 0, 0]), ("w_shape", "abc")],
)
def test_edited_layer_fields_are_refused(saved, field, value):
    members = read_members(saved)
    metadata = metadata_of(members)
    metadata["layers"]["conv"][field] = value
    resign_packed_metadata(metadata, members)
    write(saved, members, raw_metadata=json.dumps(metadata).encode().replace(b"Infinity", b"1e400"))
    with pytest.raises(PackedFormatError):
        cso.load_packed(saved)


def test_metadata_nested_a_hundred_thousand_deep_is_refused(saved):
    members = read_members(saved)
    deep = b'{"format": "cso-packed-filters", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    write(saved, members, raw_metadata=deep)
    with pytest.raises(PackedFormatError, match="nested"):
        cso.load_packed(saved)


def test_a_number_out_of_range_is_refused(saved):
    members = read_members(saved)
    text = json.dumps(metadata_of(members))
    plan_tile = '"channel_tile": '
    start = text.index(plan_tile) + len(plan_tile)
    end = text.index(",", start)
    write(saved, members, raw_metadata=(text[:start] + "1e400" + text[end:]).encode())
    with pytest.raises(PackedFormatError, match="out of range"):
        cso.load_packed(saved)


def npy_header(shape, descr="<f4") -> bytes:
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        buffer, {"descr": descr, "fortran_order": False, "shape": shape}
    )
    return buffer.getvalue()


@pytest.mark.parametrize("member", ["junk", "conv/panels"])
def test_a_member_claiming_a_trillion_elements_allocates_nothing(saved, member):
    """The header claims 4 TB; the member stores 16 bytes.  Before, every member
    was read (an unknown one too) before its name or size was checked."""
    members = read_members(saved)
    members.pop(member, None)
    np.savez(saved, **members)
    with zipfile.ZipFile(saved, "a") as archive:
        archive.writestr(f"{member}.npy", npy_header((10**12,)) + b"\0" * 16)
    with pytest.raises(PackedFormatError, match="junk|conv/panels"):
        cso.load_packed(saved)


def test_a_member_of_objects_is_refused(saved):
    with zipfile.ZipFile(saved, "a") as archive:
        archive.writestr("conv/bias2.npy", npy_header((2,), "|O") + b"\0" * 16)
    with pytest.raises(PackedFormatError):
        cso.load_packed(saved)


def test_panels_of_another_dtype_are_refused_before_they_are_read(saved):
    members = read_members(saved)
    members["conv/panels"] = members["conv/panels"].astype(np.float64)
    metadata = metadata_of(members)
    resign_packed_metadata(metadata, members)
    write(saved, members, metadata)
    with pytest.raises(PackedFormatError, match="expected float32"):
        cso.load_packed(saved)


def test_the_untouched_file_still_loads_and_computes_bit_identically(saved, layer):
    x, w, b = layer
    loaded = cso.load_packed(saved)["conv"]
    packed = cso.pack_filters(w, x.shape, bias=b, **PARAMS)
    assert np.array_equal(cso.conv2d(x, loaded), cso.conv2d(x, packed))


def test_saving_to_a_directory_leaves_nothing_behind(tmp_path, layer):
    x, w, b = layer
    packed = cso.pack_filters(w, x.shape, **PARAMS)
    before = set(tmp_path.iterdir())
    with pytest.raises(IsADirectoryError, match="is a directory"):
        cso.save_packed(tmp_path, {"conv": packed})
    assert set(tmp_path.iterdir()) == before
