"""Pre-packed filters: conv2d with them, the file format, and its validation."""

import json
import zipfile

import numpy as np
import pytest
from conftest import AVX512_CORE, assert_matches_reference

import cso
from cso.packed_file import PackedFormatError


@pytest.fixture
def layer(rng):
    x = rng.standard_normal((2, 8, 11, 12)).astype(np.float32)
    w = rng.standard_normal((20, 4, 3, 3)).astype(np.float32)
    b = rng.standard_normal(20).astype(np.float32)
    params = dict(stride=(1, 2), padding=((1, 0), (2, 1)), groups=2)
    return x, w, b, params


def test_conv2d_with_packed_filters(layer):
    x, w, b, params = layer
    packed = cso.pack_filters(w, x.shape, bias=b, **params)
    y = cso.conv2d(x, packed)
    assert_matches_reference(y, x, w, b, **params)
    # The same panels serve another batch size (re-planned, not re-packed).
    assert_matches_reference(cso.conv2d(x[:1], packed), x[:1], w, b, **params)
    # Parameters may be repeated, if they agree.
    assert_matches_reference(cso.conv2d(x, packed, **params), x, w, b, **params)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_packed_matches_unpacked_exactly(layer, dtype):
    x, w, b, params = layer
    x, w, b = x.astype(dtype), w.astype(dtype), b.astype(dtype)
    packed = cso.pack_filters(w, x.shape, bias=b, **params)
    assert packed.dtype == dtype
    assert_matches_reference(cso.conv2d(x, packed), x, w, b, **params)


def test_filter_vectorised_plan_for_few_windows(rng, tmp_path):
    """A few windows (7 rows of Nwin) fill whole vectors of windows badly,
    tiles of Nwin windows not at all.

    A filter-vectorised plan of this machine's filter-vectorised shape
    (forced: which shape the model takes is the cost weights' business;
    another machine's would compile emulated vectors and could not be
    loaded here); the panels must start on a cache line, also after a
    round trip through a file, and serve other batch sizes.
    """
    from cso.analysis import tiles
    from cso.analysis.detect import detect_hardware
    from cso.packing.filters import is_aligned

    hardware = detect_hardware()
    nf, nwin = tiles.filter_vector_blocks(hardware.vector_bytes, hardware.vector_registers, 4)[0]
    x = rng.standard_normal((2, 64, 7, nwin)).astype(np.float32)
    w = rng.standard_normal((2 * nf, 64, 3, 3)).astype(np.float32)
    b = rng.standard_normal(2 * nf).astype(np.float32)
    plan = cso.plan_conv2d(
        x.shape, w.shape, padding=1, hardware=hardware, vector_operand="filters",
        filters_per_tile=nf, windows_per_tile=nwin, filters_prepacked=True,
    )  # fmt: skip
    packed = cso.pack_filters(w, x.shape, bias=b, padding=1, plan=plan)
    assert packed.plan.vector_operand == "filters"
    # 2 * nf filters are two tiles of nf, 7 * nwin windows seven of nwin: no padding.
    assert (packed.plan.filters_per_tile, packed.plan.windows_per_tile) == (nf, nwin)
    assert is_aligned(packed.panels)
    assert_matches_reference(cso.conv2d(x, packed), x, w, b, padding=1)
    assert_matches_reference(cso.conv2d(x[:1], packed), x[:1], w, b, padding=1)
    path = tmp_path / "fvec.npz"
    cso.save_packed(path, {"layer": packed})
    loaded = cso.load_packed(path, hardware=hardware)["layer"]
    assert loaded.plan.vector_operand == "filters"
    assert is_aligned(loaded.panels)
    assert np.array_equal(cso.conv2d(x, loaded), cso.conv2d(x, packed))


def test_dot_product_plan_for_a_classifier_layer(rng, tmp_path):
    """A 7x7 convolution of a 7x7 input is a fully connected layer: one
    window, so the analysis reads filters and input as rows (dot products),
    per call and packed ahead; a whole-input window is the only kind it may
    be forced on.  This machine's kernels (another's would compile
    emulated vectors)."""
    from cso.analysis.detect import detect_hardware

    hardware = detect_hardware()
    x = rng.standard_normal((2, 64, 7, 7)).astype(np.float32)
    w = rng.standard_normal((44, 64, 7, 7)).astype(np.float32)
    b = rng.standard_normal(44).astype(np.float32)
    assert cso.plan_conv2d(x.shape, w.shape, hardware=hardware).vector_operand == "reduction"
    packed = cso.pack_filters(w, x.shape, bias=b, hardware=hardware)
    assert packed.plan.vector_operand == "reduction" and packed.panels.size == w.size
    assert_matches_reference(cso.conv2d(x, packed), x, w, b)
    path = tmp_path / "fc.npz"
    cso.save_packed(path, {"fc": packed})
    loaded = cso.load_packed(path, hardware=hardware)["fc"]
    assert np.array_equal(cso.conv2d(x, loaded), cso.conv2d(x, packed))
    with pytest.raises(ValueError, match="whole unpadded input"):
        cso.plan_conv2d(x.shape, w.shape, padding=1, vector_operand="reduction")


def test_packed_input_checks(layer):
    x, w, b, params = layer
    packed = cso.pack_filters(w, x.shape, **params)
    with pytest.raises(ValueError, match=r"x must have shape \('N', 8, 11, 12\)"):
        cso.conv2d(x[:, :, :10], packed)
    with pytest.raises(ValueError, match="bias must be None with packed filters"):
        cso.conv2d(x, packed, b)
    with pytest.raises(ValueError, match="stride"):
        cso.conv2d(x, packed, stride=2)
    with pytest.raises(ValueError, match="plan must be None"):
        cso.conv2d(x, packed, plan=packed.plan)
    with pytest.raises(ValueError, match="pack them with dtype=float64"):
        cso.conv2d(x.astype(np.float64), packed)
    with pytest.raises(ValueError, match=r"bias must have shape \(20,\)"):
        cso.pack_filters(w, x.shape, bias=b[:3], **params)


def test_round_trip_is_exact(tmp_path, layer):
    x, w, b, params = layer
    layers = {
        "first": cso.pack_filters(w, x.shape, bias=b, **params),
        "second": cso.pack_filters(w.astype(np.float64), (1, 4, 9, 9), padding="same"),
    }
    path = tmp_path / "packed.npz"
    cso.save_packed(path, layers)
    loaded = cso.load_packed(path)
    assert set(loaded) == set(layers)
    for name, original in layers.items():
        again = loaded[name]
        assert np.array_equal(again.panels, original.panels)
        assert again.panels.dtype == original.panels.dtype
        assert (again.bias is None) == (original.bias is None)
        if again.bias is not None:
            assert np.array_equal(again.bias, original.bias)
        assert again.plan == original.plan
        assert again.conv_params == original.conv_params
    assert np.array_equal(cso.conv2d(x, loaded["first"]), cso.conv2d(x, layers["first"]))


def _rewrite(path, edit):
    """Rewrite a saved file with ``edit(members)`` applied to its arrays."""
    with np.load(path, allow_pickle=False) as archive:
        members = {name: archive[name] for name in archive.files}
    edit(members)
    np.savez(path, **members)


def _metadata_edit(change):
    def edit(members):
        metadata = json.loads(members["__metadata__"].tobytes().decode())
        change(metadata)
        members["__metadata__"] = np.frombuffer(json.dumps(metadata).encode(), np.uint8)

    return edit


@pytest.fixture
def saved(tmp_path, layer):
    x, w, b, params = layer
    path = tmp_path / "packed.npz"
    cso.save_packed(path, {"conv": cso.pack_filters(w, x.shape, bias=b, **params)})
    return path


def test_truncated_file(saved):
    data = saved.read_bytes()
    saved.write_bytes(data[: len(data) // 2])
    with pytest.raises(PackedFormatError, match="not a readable .*archive"):
        cso.load_packed(saved)


def test_missing_file(tmp_path):
    with pytest.raises(PackedFormatError, match="no such file"):
        cso.load_packed(tmp_path / "absent.npz")


def test_damaged_panels_fail_the_checksum(saved):
    def flip(members):
        members["conv/panels"] = members["conv/panels"].copy()
        members["conv/panels"][5] += 1.0

    _rewrite(saved, flip)
    with pytest.raises(PackedFormatError, match="checksum"):
        cso.load_packed(saved)


def test_damaged_bytes_inside_the_zip(saved):
    data = bytearray(saved.read_bytes())
    with zipfile.ZipFile(saved) as archive:
        info = archive.getinfo("conv/panels.npy")
    middle = info.header_offset + 200
    data[middle] ^= 0xFF
    saved.write_bytes(bytes(data))
    with pytest.raises(PackedFormatError):
        cso.load_packed(saved)


def test_unknown_format_version(saved):
    _rewrite(saved, _metadata_edit(lambda m: m.update(format_version=99)))
    with pytest.raises(PackedFormatError, match="format version 99 is not supported"):
        cso.load_packed(saved)


def test_panels_for_another_micro_kernel(tmp_path, layer):
    # Packed for an AVX-512 core's dense kernel, loaded on an AVX2 one: whichever
    # this machine is.  (A grouped plan's F x segment shapes exist on both.)
    x, w, b, params = layer
    path = tmp_path / "packed.npz"
    plan = cso.plan_conv2d(
        x.shape, w.shape, hardware=AVX512_CORE, algorithm="dense", filters_prepacked=True,
        **params,
    )  # fmt: skip
    packed = cso.pack_filters(w, x.shape, bias=b, plan=plan, **params)
    cso.save_packed(path, {"conv": packed})
    avx2 = cso.Hardware(vector_bytes=32, vector_registers=16)
    with pytest.raises(
        PackedFormatError, match="micro-kernel; this machine uses 6x16, 4x16, 4x24, 8x8, 16x6, 8x1"
    ):
        cso.load_packed(path, hardware=avx2)


def test_metadata_that_is_not_json(saved):
    _rewrite(saved, lambda m: m.update(__metadata__=np.frombuffer(b"{not json", np.uint8)))
    with pytest.raises(PackedFormatError, match="not valid JSON"):
        cso.load_packed(saved)


def test_metadata_missing_or_malformed(saved):
    _rewrite(saved, _metadata_edit(lambda m: m["layers"]["conv"].pop("plan")))
    with pytest.raises(PackedFormatError, match="malformed metadata"):
        cso.load_packed(saved)
    _rewrite(saved, lambda m: m.pop("__metadata__"))
    with pytest.raises(PackedFormatError, match="no __metadata__"):
        cso.load_packed(saved)


def test_panels_of_the_wrong_size(saved):
    _rewrite(saved, lambda m: m.update({"conv/panels": m["conv/panels"][:-14]}))
    with pytest.raises(PackedFormatError, match="'conv/panels' is float32"):
        cso.load_packed(saved)


def test_save_checks_its_arguments(tmp_path, layer):
    x, w, b, params = layer
    packed = cso.pack_filters(w, x.shape, **params)
    with pytest.raises(ValueError, match="layer names"):
        cso.save_packed(tmp_path / "p.npz", {"a/b": packed})
    with pytest.raises(TypeError, match="PackedFilters"):
        cso.save_packed(tmp_path / "p.npz", {"a": w})
    with pytest.raises(ValueError, match="non-empty dict"):
        cso.save_packed(tmp_path / "p.npz", {})


def test_packing_for_a_given_plan(rng, tmp_path):
    """pack_filters(plan=...) packs for that plan (here the batch folded into
    the windows), checks it belongs to the problem, and the packed filters
    serve other batch sizes and a file round trip."""
    x = rng.standard_normal((3, 16, 7, 7)).astype(np.float32)
    w = rng.standard_normal((40, 16, 3, 3)).astype(np.float32)
    b = rng.standard_normal(40).astype(np.float32)
    plan = cso.plan_conv2d(
        x.shape, w.shape, padding=1, vector_operand="filters", fold_batch=True, threads=1
    )
    packed = cso.pack_filters(w, x.shape, padding=1, bias=b, plan=plan)
    assert packed.plan is plan and plan.batch_folded
    assert_matches_reference(cso.conv2d(x, packed, threads=1), x, w, b, padding=1)
    assert_matches_reference(cso.conv2d(x[:2], packed, threads=1), x[:2], w, b, padding=1)
    path = tmp_path / "folded.npz"
    cso.save_packed(path, {"layer": packed})
    loaded = cso.load_packed(path)["layer"]
    assert loaded.plan.batch_folded
    assert np.array_equal(cso.conv2d(x, loaded, threads=1), cso.conv2d(x, packed, threads=1))
    with pytest.raises(TypeError, match="plan"):
        cso.pack_filters(w, x.shape, padding=1, plan=plan.to_dict())
    with pytest.raises(ValueError, match="plan was made for another problem"):
        cso.pack_filters(w, x.shape, padding=0, plan=plan)
    with pytest.raises(ValueError, match="plan was made for another problem"):
        cso.pack_filters(w, x.shape, padding=1, dtype=np.float64, plan=plan)


def test_repeated_packed_calls_stay_checked_and_hold_no_filters():
    """The cache of checked packed calls: a repeat gives the same result, a new
    input shape or a bad ``out`` is still refused, and it keeps no panels alive."""
    import gc
    import weakref

    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 8, 6, 6)).astype(np.float32)
    w = rng.standard_normal((16, 8, 3, 3)).astype(np.float32)
    packed = cso.pack_filters(w, x.shape, padding=1, threads=1)
    first = cso.conv2d(x, packed, threads=1, activation="relu")
    assert np.array_equal(cso.conv2d(x, packed, threads=1, activation="relu"), first)
    with pytest.raises(ValueError, match="x must have shape"):
        cso.conv2d(x[:, :4], packed, threads=1)
    with pytest.raises(ValueError, match="out must have shape"):
        cso.conv2d(x, packed, threads=1, out=np.empty((1, 16, 6, 5), np.float32))
    with pytest.raises(ValueError, match="activation"):
        cso.conv2d(x, packed, threads=1, activation="tanh")
    panels = weakref.ref(packed.panels)
    del packed
    gc.collect()
    assert panels() is None


def test_repeated_packed_calls_that_repeat_their_geometry_stay_checked():
    """A call repeating the packed filters' own stride and padding is met again
    as a repeat (the cache keys the parameters as given): same result, and a
    parameter of another value or type is still checked, not matched."""
    rng = np.random.default_rng(6)
    x = rng.standard_normal((1, 8, 9, 9)).astype(np.float32)
    w = rng.standard_normal((16, 8, 3, 3)).astype(np.float32)
    packed = cso.pack_filters(w, x.shape, stride=2, padding=1, threads=1)
    expected = cso.conv2d(x, w, stride=2, padding=1, threads=1)
    for _ in range(3):
        assert np.array_equal(cso.conv2d(x, packed, stride=2, padding=1, threads=1), expected)
    with pytest.raises(ValueError, match="padding"):
        cso.conv2d(x, packed, stride=2, padding=2, threads=1)
    with pytest.raises(TypeError, match="padding"):
        cso.conv2d(x, packed, stride=2, padding=True, threads=1)
    with pytest.raises(ValueError, match="x must have shape"):
        cso.conv2d(x[:, :4], packed, stride=2, padding=1, threads=1)
