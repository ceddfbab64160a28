"""LLVM IR pieces every generated kernel shares: the float vector type, the
FMA and masked-memory intrinsics, run-time lane masks, the in-register
transpose, and an emitter of operand pointers, masked loads and stores and
prefetches.

The kernels (:mod:`.outer_product`, :mod:`.taps`, :mod:`.lane_taps`,
:mod:`.epilogue`) emit their own loops; what they declare, check and build
the same way lives here once.
"""

from __future__ import annotations

import functools

from llvmlite import ir
from numba import types
from numba.core import cgutils

from ..packing.transpose import prefetch_function, transpose_rows

_LLVM_FLOAT = {"float32": ir.FloatType, "float64": ir.DoubleType}
_SUFFIX = {"float32": "f32", "float64": "f64"}

I32 = ir.IntType(32)


def check_float_arrays(dtype_name: str, **arrays) -> None:
    """At typing: raise TypeError unless each named argument is a 1-D
    ``dtype_name`` array (the kernels' float operands)."""
    numba_type = getattr(types, dtype_name)
    for label, arg in arrays.items():
        if not (isinstance(arg, types.Array) and arg.dtype == numba_type and arg.ndim == 1):
            raise TypeError(f"{label} must be a 1-D {dtype_name} array, got {arg}")


def vector_type(dtype_name: str, lanes: int) -> ir.VectorType:
    """``<lanes x float>`` or ``<lanes x double>``."""
    return ir.VectorType(_LLVM_FLOAT[dtype_name](), lanes)


def _suffix(vector: ir.VectorType) -> str:
    element = "f32" if isinstance(vector.element, ir.FloatType) else "f64"
    return f"v{vector.count}{element}"


def fma_function(module, vector: ir.VectorType):
    """``llvm.fma`` on ``vector``: ``fma(a, b, c) = a * b + c``, one rounding."""
    return cgutils.get_or_insert_function(
        module, ir.FunctionType(vector, [vector] * 3), f"llvm.fma.{_suffix(vector)}"
    )


def masked_load_function(module, vector: ir.VectorType):
    """``llvm.masked.load`` of ``vector``: ``load(pointer, align, mask, passthrough)``."""
    mask = ir.VectorType(ir.IntType(1), vector.count)
    return cgutils.get_or_insert_function(
        module,
        ir.FunctionType(vector, [vector.as_pointer(), I32, mask, vector]),
        f"llvm.masked.load.{_suffix(vector)}.p0",
    )


def masked_store_function(module, vector: ir.VectorType):
    """``llvm.masked.store`` of ``vector``: ``store(value, pointer, align, mask)``."""
    mask = ir.VectorType(ir.IntType(1), vector.count)
    return cgutils.get_or_insert_function(
        module,
        ir.FunctionType(ir.VoidType(), [vector, vector.as_pointer(), I32, mask]),
        f"llvm.masked.store.{_suffix(vector)}.p0",
    )


def keep_loop_rolled(branch) -> None:
    """Mark ``branch``, a loop's back edge, so that LLVM does not unroll the loop.

    Loop metadata (``!llvm.loop !N`` with ``!N = !{!N, !{"llvm.loop.unroll.disable"}}``);
    the loop ID must refer to itself, which llvmlite's ``add_metadata``
    cannot build, so its first operand is set after it is made (a unique
    string keeps it out of the module's metadata cache).
    """
    module = branch.parent.parent.module
    option = module.add_metadata([ir.MetaDataString(module, "llvm.loop.unroll.disable")])
    unique = ir.MetaDataString(module, f"cso.loop.{len(module.metadata)}")
    loop_id = module.add_metadata([option, unique])
    loop_id.operands = (loop_id, option)
    branch.set_metadata("llvm.loop", loop_id)


def store_leading_lanes(builder, value, address, count: int, element_bytes: int) -> None:
    """Store the first ``count`` lanes of the vector ``value`` at ``address``
    (a pointer to its vector type) as plain stores of power-of-two pieces
    (6 of 8 lanes: 4, then 2), not as a masked store; on a target with
    AVX-512's mask registers (:func:`target_has_mask_registers`), as one
    store under a constant mask.

    AVX2's masked store is microcoded on AMD: on an EPYC (Zen 3) the 16 x 6
    filter-vectorised kernel, whose every row is a store of 6 of 8 lanes,
    ran 1.27x faster at depth 64 and 1.20x at 256 (the same at 1024) with
    its rows stored in pieces (both builds in one process, interleaved,
    L1-resident tile).  AVX-512's store under a mask register is one
    instruction, where the pieces of 14 of 16 lanes take two shuffles (on
    the port 512-bit FMAs share on Intel) and three stores: on a Xeon
    (Sapphire Rapids) the row kernel's 5x5 block of 7 rows of 14 lanes ran
    in 41.2 ns against 45.8 (``experiments/row_ceiling.py``'s nest, one
    thread, warm).
    """
    element = value.type.element
    i32 = ir.IntType(32)
    if target_has_mask_registers():
        lanes = value.type.count
        mask = ir.Constant(ir.VectorType(ir.IntType(1), lanes), [i < count for i in range(lanes)])
        store = masked_store_function(builder.module, value.type)
        pointer = builder.bitcast(address, value.type.as_pointer())
        builder.call(store, [value, pointer, ir.Constant(i32, element_bytes), mask])
        return
    elements = builder.bitcast(address, element.as_pointer())
    first, size = 0, 1 << (count.bit_length() - 1)
    while first < count:
        if first + size <= count:
            target = builder.gep(elements, [ir.Constant(i32, first)])
            if size == 1:
                piece = builder.extract_element(value, ir.Constant(i32, first))
            else:
                piece = builder.shuffle_vector(
                    value,
                    ir.Constant(value.type, ir.Undefined),
                    ir.Constant(ir.VectorType(i32, size), list(range(first, first + size))),
                )
                target = builder.bitcast(target, piece.type.as_pointer())
            builder.store(piece, target, align=element_bytes)
            first += size
        size //= 2


def lanes_below(builder, count, lanes: int):
    """The ``<lanes x i1>`` mask of lanes ``j < count``, ``count`` an integer
    IR value known at run time only."""
    index_type = ir.VectorType(count.type, lanes)
    undef = ir.Constant(index_type, ir.Undefined)
    splat = builder.shuffle_vector(
        builder.insert_element(undef, count, ir.Constant(I32, 0)),
        undef,
        ir.Constant(ir.VectorType(I32, lanes), [0] * lanes),
    )
    return builder.icmp_signed("<", ir.Constant(index_type, list(range(lanes))), splat)


def transpose(builder, rows) -> list:
    """``rows[j][i] -> result[i][j]`` for ``VL`` vectors of ``VL`` lanes:
    :func:`cso.packing.transpose.transpose_rows`, which the filter packing
    shares (and whose file every generated module hashes)."""
    return transpose_rows(builder, rows)


def check_shape_bounds(*bounds) -> None:
    """Raise ValueError unless every ``(label, value, top)`` has ``1 <= value
    <= top``: a generated kernel's shape parameters, checked before any IR."""
    for label, value, top in bounds:
        if not 1 <= value <= top:
            raise ValueError(f"{label} must be in [1, {top}], got {value}")


def check_dtype_and_lanes(dtype_name: str, lanes: int) -> None:
    """Raise ValueError unless ``dtype_name`` is float32 or float64 and
    ``lanes`` a power of two in [2, 64]."""
    if dtype_name not in _LLVM_FLOAT:
        raise ValueError(f"dtype_name must be float32 or float64, got {dtype_name!r}")
    if lanes < 2 or lanes > 64 or lanes & (lanes - 1):
        raise ValueError(f"vector_lanes must be a power of two in [2, 64], got {lanes}")


def target_has_mask_registers() -> bool:
    """Whether the machine code Numba generates in this process may use
    AVX-512's mask registers: it compiles for the host (no
    ``NUMBA_CPU_NAME``), whose features have ``avx512f``, or for the
    features ``NUMBA_CPU_FEATURES`` names, which have it."""
    from numba.core import config

    if config.CPU_FEATURES is not None:
        features = config.CPU_FEATURES
    elif config.CPU_NAME is not None:
        return False  # a named CPU's features are not listed here: assume none
    else:
        features = _host_features()
    return "+avx512f" in features.split(",")


@functools.lru_cache(maxsize=None)
def _host_features() -> str:
    """LLVM's list of the host's features, asked once: each query took ~0.3
    ms, and a kernel's generation asks at every partial store it emits."""
    import llvmlite.binding as llvm

    return llvm.get_host_cpu_features().flatten()


_asm_parser = []  # [True] once LLVM can read inline assembly (Numba does not ask)


def _ready_asm_parser() -> None:
    if not _asm_parser:
        import llvmlite.binding as llvm

        llvm.initialize_native_asmparser()
        _asm_parser.append(True)


class KernelEmitter:
    """What a kernel's code generation does alike for any of its operands:
    pointers into its array arguments, run-time lane masks, whole and masked
    vector loads and stores, prefetches (the tap and lane kernels',
    :mod:`.taps`, :mod:`.lane_taps` and :mod:`.lane_transposes`)."""

    def __init__(self, context, builder, signature, dtype_name, lanes):
        self.context, self.builder, self.signature, self.lanes = context, builder, signature, lanes
        self.intp = context.get_value_type(types.intp)
        self.vector = vector_type(dtype_name, lanes)
        self.align = self.element_bytes = 4 if dtype_name == "float32" else 8
        self.mask_type = ir.VectorType(ir.IntType(1), lanes)
        self.fma = fma_function(builder.module, self.vector)
        self.masked_load = masked_load_function(builder.module, self.vector)
        self.masked_store = masked_store_function(builder.module, self.vector)
        self.zero = ir.Constant(self.vector, [0.0] * lanes)
        self.prefetch = prefetch_function(builder.module)

    def constant(self, value):
        return ir.Constant(self.intp, value)

    def base(self, index, array, offset):
        """A pointer to element ``offset`` of the kernel's array argument ``index``."""
        data = self.context.make_array(self.signature.args[index])(
            self.context, self.builder, array
        ).data
        return self.builder.gep(data, [offset])

    def vector_at(self, base, offset):
        return self.builder.bitcast(self.builder.gep(base, [offset]), self.vector.as_pointer())

    def lanes_below(self, count):
        """The mask of lanes ``j < count``."""
        return lanes_below(self.builder, count, self.lanes)

    def broadcast(self, scalar):
        """``scalar`` (a float IR value) in every lane of a vector."""
        undef = ir.Constant(self.vector, ir.Undefined)
        single = self.builder.insert_element(undef, scalar, ir.Constant(I32, 0))
        return self.builder.shuffle_vector(
            single, undef, ir.Constant(ir.VectorType(I32, self.lanes), [0] * self.lanes)
        )

    def masked_fma(self, a, b, total, mask):
        """``a * b + total`` in the lanes ``mask`` sets, ``total`` in the
        others: one ``vfmadd231`` under a mask register, for AVX-512 targets
        only (:func:`target_has_mask_registers`).  Inline assembly: LLVM
        folded a run of selects on one mask into blends after plain FMAs
        (111 ``vblendmps`` beside 175 FMAs in a 5x5 block of the row kernel)."""
        _ready_asm_parser()
        suffix = "ps" if self.element_bytes == 4 else "pd"
        function_type = ir.FunctionType(self.vector, [self.vector] * 3 + [self.mask_type])
        # AT&T order: vfmadd231 b, a, total {k} sets total = a * b + total in k's lanes.
        asm = ir.InlineAsm(
            function_type, f"vfmadd231{suffix} $2, $1, $0 {{$4}}", "=v,v,v,0,^Yk"
        )
        return self.builder.call(asm, [a, b, total, mask])

    def bit_set_mask(self, base, index):
        """The lane mask stored as an int32 bit set at element ``index`` of
        ``base`` (bit ``l``: lane ``l``; the mask tables of the plane and row
        kernels)."""
        word = self.builder.load(self.builder.gep(base, [self.constant(index)]))
        return self.builder.bitcast(
            self.builder.trunc(word, ir.IntType(self.lanes)), self.mask_type
        )

    def masked_by(self, mask, condition):
        """``mask`` where the run-time ``condition`` holds, else no lane."""
        every = ir.Constant(self.mask_type, [1] * self.lanes)
        none = ir.Constant(self.mask_type, [0] * self.lanes)
        return self.builder.and_(mask, self.builder.select(condition, every, none))

    def lane_vector_mask(self, base, index):
        """The lane mask stored as a vector of int32 (all ones or zero) from
        element ``index`` of ``base``, widened to the element's width: one
        load, where a bit set (:meth:`bit_set_mask`) takes AVX2 four
        instructions to expand."""
        b = self.builder
        i32 = ir.VectorType(I32, self.lanes)
        address = b.bitcast(b.gep(base, [self.constant(index)]), i32.as_pointer())
        mask = b.load(address, align=4)
        if self.element_bytes == 4:
            return mask
        return b.sext(mask, ir.VectorType(ir.IntType(self.element_bytes * 8), self.lanes))

    def zeroed_outside(self, value, lane_mask):
        """``value`` with the lanes that ``lane_mask`` (a
        :meth:`lane_vector_mask`) does not set made zero: a bitwise and,
        which any of AMD's four vector pipes runs, where a blend competes
        with the FMAs and a masked load is slower."""
        b = self.builder
        integer = ir.VectorType(ir.IntType(self.element_bytes * 8), self.lanes)
        return b.bitcast(b.and_(b.bitcast(value, integer), lane_mask), self.vector)

    def prefetch_for_store(self, base, offset):
        """``llvm.prefetch`` of element ``offset`` of ``base`` for writing,
        into every cache level."""
        address = self.builder.bitcast(
            self.builder.gep(base, [offset]), ir.IntType(8).as_pointer()
        )
        self.builder.call(
            self.prefetch, [address, ir.Constant(I32, 1), ir.Constant(I32, 3), ir.Constant(I32, 1)]
        )

    def load(self, base, offset, mask=None, passthru=None):
        """The vector at element ``offset`` of ``base``: whole when ``mask``
        is None, else the lanes ``mask`` sets, the others ``passthru``'s
        (zero when None)."""
        address = self.vector_at(base, offset)
        if mask is None:
            return self.builder.load(address, align=self.align)
        others = self.zero if passthru is None else passthru
        return self.builder.call(
            self.masked_load, [address, ir.Constant(I32, self.align), mask, others]
        )

    def store(self, value, base, offset, mask=None):
        """Store ``value`` at element ``offset`` of ``base``: whole when
        ``mask`` is None, else the lanes ``mask`` sets."""
        address = self.vector_at(base, offset)
        if mask is None:
            self.builder.store(value, address, align=self.align)
            return
        self.builder.call(self.masked_store, [value, address, ir.Constant(I32, self.align), mask])


def check_mask_table(masks) -> None:
    """At typing: raise TypeError unless ``masks`` is a 1-D int32 array (a
    table of lane bit sets, :meth:`KernelEmitter.bit_set_mask`)."""
    if not (isinstance(masks, types.Array) and masks.dtype == types.int32 and masks.ndim == 1):
        raise TypeError(f"masks must be a 1-D int32 array, got {masks}")


def check_bit_set_lanes(vector_lanes: int) -> None:
    """Raise ValueError unless ``vector_lanes`` fits an int32 bit set."""
    if vector_lanes > 32:
        raise ValueError(f"vector_lanes must be at most 32 (int32 masks), got {vector_lanes}")
