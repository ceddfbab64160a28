"""Packing panel rows from input rows: the primitive packing is built on.

* :func:`pack_row_runs` fills panel rows from one input row, with zeros
  where the window reads padding: shifted masked loads for stride 1
  (vector-based packing: the row is in L1 after the first load, and every
  shifted copy is served from there), masked gathers for other strides.

The channel loop prefetches the rows of a channel a few channels ahead
where channels lie far apart (:data:`PREFETCH_CHANNELS`).

A run's last, partial vector is stored by :func:`.run_stores.store_vector`
(plain pieces, never a masked store).  Every run of any length costs
``ceil(count / lanes)`` vector operations and no scalar tail.

It takes a last argument ``vector``, the vector token of the plan's
width (:func:`~cso.packing.transpose.vector_token`); LLVM lowers the
generic vectors to AVX-512, AVX2 or NEON, so the routines are portable.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from .run_stores import store_vector
from .transpose import check_float_pair, masked_load_store, prefetch_function, token_lanes

# Software prefetch of the channel loop: the rows of channel ``c + 4`` are
# asked for while channel ``c``'s are copied, line by line, where channels
# lie at least 2 KiB apart.  Each channel's rows are a short run on a page
# of their own there, which the hardware prefetchers, following a stream
# within a page, reach too late: on an AMD EPYC (Zen 3) the packing waited
# on the L3 for most of its time (a 1x1 layer's panels, 256 channels of
# 56x56, packed at 19 GB/s of input).  Prefetched, ResNet-50's layers with
# 56x56 inputs ran 1.09-1.58x faster (``l1 1x1 256->64 @56`` 1.58x, ``l2
# 1x1 256->128 @56`` 1.18x, ``l1 3x3 64 @56`` 1.09x), those with 28x28
# inputs 1.00-1.12x, its dense layers 1.05x in all (one thread, paired
# rounds in one process); two channels ahead did as well, and with
# channels closer than 2 KiB (14x14 and 7x7 planes) the prefetches cost up
# to 8% and are not made.
PREFETCH_CHANNELS = 4
PREFETCH_MIN_STRIDE_BYTES = 2048
# Bytes between two prefetches of a run: the line of x86 and most ARM cores
# (one with longer lines is asked for some lines twice, at no harm).
PREFETCH_LINE_BYTES = 64


@intrinsic
def pack_row_runs(
    typingctx,
    dst,
    dst_offset,
    dst_stride,
    src,
    src_row,
    first_column,
    column_step,
    shift,
    copies,
    count,
    room,
    room_step,
    row_width,
    channels,
    dst_channel_stride,
    src_channel_stride,
    vector,
):
    """Pack ``copies`` panel rows from one input row of each of ``channels``
    channels, zeros where it has none.

    Row ``s`` (``0 <= s < copies``) of the result, ``dst[dst_offset +
    s*dst_stride + t]`` for ``t < count``, is the input element at column
    ``col = first_column + s*shift + t*column_step`` of the row starting at
    ``src[src_row]``, or zero when ``col`` is outside ``[0, row_width)``
    (padding; ``row_width = 0`` zeroes whole rows that lie in the padding).
    Channel ``c`` repeats this with ``dst`` and ``src`` moved on by
    ``c*dst_channel_stride`` and ``c*src_channel_stride``: one call packs a
    kernel row ``r`` for a whole channel tile.

    ``room`` (at least ``count``) is how far the last copy's destination
    row may be written from its start, and copy ``s``'s ``room + (copies - 1
    - s)*room_step``: a run's last, partial vector is stored whole
    (its lanes past ``count`` hold what its load gave: zeros, or on the
    stride-2 path the row's next elements) where it ends within ``room``, and
    in plain pieces (:func:`store_vector`) where it does not.  The input
    panels pass the rest of the panel row, which later runs rewrite: a
    masked store is microcoded on AMD, and on an EPYC (Zen 3) one tile of a
    7x7 layer's panel (512 channels, 3x3, 16 windows: runs of 7, 7 and 2)
    packed 1.7x faster this way than with every partial vector masked, a
    14x14 layer's 1.3x, a 56x56 one's (runs of whole vectors) the same
    (both in one process, ``/tmp`` script, interleaved).  ``room_step`` lets
    a copy run on into the rows of the copies after it (``dst_stride`` when
    the caller rewrites them all, 0 to keep each copy to its own room).

    With ``column_step == 1`` each row is a masked vector load at a shifted
    start: the same input segment shifted by ``shift`` elements per row, the
    vector-based packing of stride-1 convolutions.  Stride 2 loads two
    contiguous vectors and keeps their even lanes (one shuffle); other strides
    fetch the lanes by a masked gather.  Masked-off lanes are never read, so columns
    outside the input cost nothing and cannot fault.
    """
    check_float_pair("pack_row_runs", dst, src)
    float_type = dst.dtype
    lanes = token_lanes(vector)
    sig = types.void(
        dst,
        types.intp,
        types.intp,
        src,
        *[types.intp] * 12,
        vector,
    )

    def codegen(context, builder, signature, args):
        (
            dst_a,
            dst_off,
            dst_stride,
            src_a,
            src_row,
            first_column_v,
            step_v,
            shift_v,
            copies_v,
            count_v,
            room_v,
            room_step_v,
            width_v,
            channels_v,
            dst_channel_stride,
            src_channel_stride,
            _,
        ) = args
        element = context.get_value_type(float_type)
        element_bytes = 4 if float_type == types.float32 else 8
        suffix = "f32" if float_type == types.float32 else "f64"
        vector = ir.VectorType(element, lanes)
        pointer = vector.as_pointer()
        intp = count_v.type
        i32 = ir.IntType(32)
        # Lane positions and their bounds fit in 32 bits (they are < Nwin or a
        # row width); 32-bit lanes make every mask one compare of one register.
        lane_vector = ir.VectorType(i32, lanes)
        mask_type = ir.VectorType(ir.IntType(1), lanes)
        pointer_vector = ir.VectorType(element.as_pointer(), lanes)
        load, _ = masked_load_store(builder.module, vector)
        gather = cgutils.get_or_insert_function(
            builder.module,
            ir.FunctionType(vector, [pointer_vector, i32, mask_type, vector]),
            f"llvm.masked.gather.v{lanes}{suffix}.v{lanes}p0",
        )
        dst_ptr = builder.gep(
            context.make_array(signature.args[0])(context, builder, dst_a).data, [dst_off]
        )
        row_ptr = builder.gep(
            context.make_array(signature.args[3])(context, builder, src_a).data, [src_row]
        )
        zero = ir.Constant(intp, 0)
        one = ir.Constant(intp, 1)
        lane_index = ir.Constant(lane_vector, list(range(lanes)))
        align = ir.Constant(i32, element_bytes)
        zero_vector = ir.Constant(vector, [0.0] * lanes)

        def splat(value, vector_type=lane_vector):
            if vector_type.element != value.type:
                value = builder.trunc(value, vector_type.element)
            undef = ir.Constant(vector_type, ir.Undefined)
            single = builder.insert_element(undef, value, ir.Constant(i32, 0))
            return builder.shuffle_vector(
                single, undef, ir.Constant(ir.VectorType(i32, lanes), [0] * lanes)
            )

        def ceil_div(numerator, denominator):
            # ceil(n / d) for d > 0 and any sign of n (sdiv truncates toward zero).
            quotient = builder.sdiv(numerator, denominator)
            remainder = builder.srem(numerator, denominator)
            return builder.add(
                quotient, builder.zext(builder.icmp_signed(">", remainder, zero), intp)
            )

        def clamp(value, low, high):
            value = builder.select(builder.icmp_signed("<", value, low), low, value)
            return builder.select(builder.icmp_signed(">", value, high), high, value)

        count_splat = splat(count_v)
        prefetch = prefetch_function(builder.module)
        # The columns one channel's copies span, in bytes: the run prefetched.
        span_columns = builder.add(
            builder.add(
                builder.mul(builder.sub(copies_v, one), shift_v),
                builder.mul(builder.sub(count_v, one), step_v),
            ),
            one,
        )
        span_bytes = builder.mul(span_columns, ir.Constant(intp, element_bytes))
        line = ir.Constant(intp, PREFETCH_LINE_BYTES)
        far_apart = builder.icmp_signed(
            ">=",
            builder.mul(src_channel_stride, ir.Constant(intp, element_bytes)),
            ir.Constant(intp, PREFETCH_MIN_STRIDE_BYTES),
        )

        def emit_prefetch(source):
            # The run of the channel PREFETCH_CHANNELS on, a line at a time
            # (a prefetch past the input does not fault).
            ahead = builder.gep(
                source,
                [builder.add(
                    builder.mul(ir.Constant(intp, PREFETCH_CHANNELS), src_channel_stride),
                    first_column_v,
                )],
            )  # fmt: skip
            ahead = builder.bitcast(ahead, ir.IntType(8).as_pointer())
            head = builder.basic_block
            loop = builder.append_basic_block("prefetch.line")
            done = builder.append_basic_block("prefetch.done")
            builder.branch(loop)
            builder.position_at_end(loop)
            offset = builder.phi(intp)
            offset.add_incoming(zero, head)
            builder.call(prefetch, [builder.gep(ahead, [offset]), i32(0), i32(3), i32(1)])
            following = builder.add(offset, line)
            offset.add_incoming(following, loop)
            builder.cbranch(builder.icmp_signed("<", following, span_bytes), loop, done)
            builder.position_at_end(done)

        def emit_rows(name, fetch, lane_range, prefetching):
            """Loop over the channels, the copies and their vectors.
            ``lane_range(row_start)`` gives the lanes ``[low, high)`` that read
            the input (None: all of them); ``fetch(source, row_start, start,
            read)`` loads those lanes from the channel's row ``source``."""
            head = builder.basic_block
            channel_loop = builder.append_basic_block(f"{name}.channel")
            outer = builder.append_basic_block(f"{name}.row")
            inner = builder.append_basic_block(f"{name}.vector")
            next_row = builder.append_basic_block(f"{name}.next")
            next_channel = builder.append_basic_block(f"{name}.next_channel")
            end = builder.append_basic_block(f"{name}.end")
            builder.branch(channel_loop)
            builder.position_at_end(channel_loop)
            channel = builder.phi(intp)
            channel.add_incoming(zero, head)
            source = builder.gep(row_ptr, [builder.mul(channel, src_channel_stride)])
            target = builder.gep(dst_ptr, [builder.mul(channel, dst_channel_stride)])
            if prefetching:
                emit_prefetch(source)
            channel_body = builder.basic_block
            builder.branch(outer)
            builder.position_at_end(outer)
            copy = builder.phi(intp)
            copy.add_incoming(zero, channel_body)
            target_row = builder.gep(target, [builder.mul(copy, dst_stride)])
            copies_after = builder.sub(builder.sub(copies_v, one), copy)
            copy_room = builder.add(room_v, builder.mul(copies_after, room_step_v))
            row_start = builder.add(first_column_v, builder.mul(copy, shift_v))
            bounds = lane_range(row_start)
            if bounds is not None:
                low = clamp(bounds[0], zero, count_v)
                low_splat, high_splat = splat(low), splat(clamp(bounds[1], low, count_v))
            builder.branch(inner)
            builder.position_at_end(inner)
            start = builder.phi(intp)
            start.add_incoming(zero, outer)
            lanes_t = builder.add(splat(start), lane_index)
            in_run = builder.icmp_signed("<", lanes_t, count_splat)
            read = (
                in_run
                if bounds is None
                else builder.and_(
                    builder.icmp_signed(">=", lanes_t, low_splat),
                    builder.icmp_signed("<", lanes_t, high_splat),
                )
            )
            values = fetch(source, row_start, start, read)
            following = builder.add(start, ir.Constant(intp, lanes))
            address = builder.bitcast(builder.gep(target_row, [start]), pointer)
            # A vector that ends within the room is stored whole, its lanes
            # past the run too (the caller rewrites them later): see above.
            fits = builder.icmp_signed("<=", following, copy_room)
            remaining = builder.sub(count_v, start)
            store_vector(builder, values, address, element_bytes, remaining, fits)
            start.add_incoming(following, builder.basic_block)
            builder.cbranch(builder.icmp_signed("<", following, count_v), inner, next_row)
            builder.position_at_end(next_row)
            after = builder.add(copy, one)
            copy.add_incoming(after, next_row)
            builder.cbranch(builder.icmp_signed("<", after, copies_v), outer, next_channel)
            builder.position_at_end(next_channel)
            following_channel = builder.add(channel, one)
            channel.add_incoming(following_channel, next_channel)
            builder.cbranch(
                builder.icmp_signed("<", following_channel, channels_v), channel_loop, end
            )
            builder.position_at_end(end)

        def shifted_load(source, row_start, start, read):
            first = builder.gep(source, [builder.add(row_start, start)])
            return builder.call(load, [builder.bitcast(first, pointer), align, read, zero_vector])

        def unit_range(row_start):
            # Lanes t with 0 <= row_start + t < width: no division on this path.
            return builder.sub(zero, row_start), builder.sub(width_v, row_start)

        def strided_range(row_start):
            # Lanes t with 0 <= row_start + t*step < width.
            return (
                ceil_div(builder.sub(zero, row_start), step_v),
                ceil_div(builder.sub(width_v, row_start), step_v),
            )

        index_vector = ir.VectorType(intp, lanes)
        wide_lanes = ir.Constant(index_vector, list(range(lanes)))

        def strided_gather(source, row_start, start, read):
            # Addresses of masked-off lanes may lie outside the input: computed
            # as integers, never dereferenced.
            step_bytes = builder.mul(step_v, ir.Constant(intp, element_bytes))
            first = builder.add(
                builder.ptrtoint(source, intp),
                builder.add(
                    builder.mul(row_start, ir.Constant(intp, element_bytes)),
                    builder.mul(start, step_bytes),
                ),
            )
            offsets = builder.mul(wide_lanes, splat(step_bytes, index_vector))
            addresses = builder.inttoptr(
                builder.add(splat(first, index_vector), offsets), pointer_vector
            )
            return builder.call(gather, [addresses, align, read, zero_vector])

        even_lanes = ir.Constant(lane_vector, list(range(0, 2 * lanes, 2)))

        def deinterleaved_load(source, row_start, start, read):
            # Stride 2: two contiguous loads cover the 2*lanes columns from
            # row_start + 2*start; the even ones are this vector's lanes.
            # Where the columns reach past the row, the loads are masked and
            # the lanes outside load as zero, so lanes that read padding come
            # out zero without a mask of their own; inside it (most vectors
            # of a row), plain loads: the masks cost more than the copy.
            first = builder.add(row_start, builder.add(start, start))
            inside_row = builder.and_(
                builder.icmp_signed(">=", first, zero),
                builder.icmp_signed(
                    "<=", builder.add(first, ir.Constant(intp, 2 * lanes)), width_v
                ),
            )
            addresses = [
                builder.bitcast(
                    builder.gep(source, [builder.add(first, ir.Constant(intp, half * lanes))]),
                    pointer,
                )
                for half in range(2)
            ]
            with builder.if_else(inside_row) as (plain, bordered):
                with plain:
                    plain_halves = [builder.load(a, align=element_bytes) for a in addresses]
                    plain_block = builder.basic_block
                with bordered:
                    # Each half's mask from a compare of its own lanes: one
                    # mask of 2*lanes split in two cost AVX2 some twenty
                    # instructions of packing and unpacking a vector.
                    masked_halves = []
                    for half in range(2):
                        columns = builder.add(
                            splat(builder.add(first, ir.Constant(intp, half * lanes))), lane_index
                        )
                        mask = builder.and_(
                            builder.icmp_signed(">=", columns, splat(zero)),
                            builder.icmp_signed("<", columns, splat(width_v)),
                        )
                        masked_halves.append(
                            builder.call(load, [addresses[half], align, mask, zero_vector])
                        )
                    bordered_block = builder.basic_block
            halves = []
            for half in range(2):
                phi = builder.phi(vector)
                phi.add_incoming(plain_halves[half], plain_block)
                phi.add_incoming(masked_halves[half], bordered_block)
                halves.append(phi)
            return builder.shuffle_vector(halves[0], halves[1], even_lanes)

        work = builder.and_(
            builder.and_(
                builder.icmp_signed(">", count_v, zero), builder.icmp_signed(">", copies_v, zero)
            ),
            builder.icmp_signed(">", channels_v, zero),
        )
        last_column = builder.add(
            first_column_v,
            builder.add(
                builder.mul(builder.sub(copies_v, one), shift_v),
                builder.mul(builder.sub(count_v, one), step_v),
            ),
        )
        # The common case: every lane of every copy inside the row.
        interior = builder.and_(
            builder.icmp_signed(">=", first_column_v, zero),
            builder.icmp_signed("<", last_column, width_v),
        )
        contiguous = builder.icmp_signed("==", step_v, one)
        two = builder.icmp_signed("==", step_v, ir.Constant(intp, 2))

        def emit_kinds(prefetching):
            with builder.if_else(contiguous) as (shifted, gathered):
                with shifted:
                    with builder.if_else(interior) as (inside, bordered):
                        with inside:
                            emit_rows("interior", shifted_load, lambda start: None, prefetching)
                        with bordered:
                            emit_rows("shifted", shifted_load, unit_range, prefetching)
                with gathered:
                    with builder.if_else(two) as (pairs, other):
                        with pairs:
                            emit_rows("pairs", deinterleaved_load, lambda start: None, prefetching)
                        with other:
                            emit_rows("gathered", strided_gather, strided_range, prefetching)

        with builder.if_then(work):
            with builder.if_else(far_apart) as (far, near):
                with far:
                    emit_kinds(True)
                with near:
                    emit_kinds(False)
        return context.get_dummy_value()

    return sig, codegen
