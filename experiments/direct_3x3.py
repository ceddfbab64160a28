"""A stride-1 3x3 convolution without input panels, against cso's packed panels (one thread).

    python experiments/direct_3x3.py [NF]

Last session's note named this as what would lift the 3x3 layers: read the
windows from one zero-padded copy of the input instead of 9x-expanded
panels, which removes the input packing (up to 18% of a layer).  Here the
copy is laid out ``[H+2][C][W']`` (rows of one channel ``W'`` apart, so a
reduction step moves by one short row, not by a plane), a window tile is 32
consecutive outputs of one row, and each output tile takes nine calls of
the same micro-kernel (one per ``(r, s)``, depth ``Nc``, accumulating),
with the filter panels read at a stride of ``R*S*Nf``.  Filters are packed
ahead for both; the copy's time is included.  Prints the share of the FMA
peak of cso (filters packed ahead) and of this loop, on ResNet-50's and
VGG-16's stride-1 3x3 layers with at least one full window tile per row.
A prototype: one thread, filter blocks of ~600 KB for L2, no edge-free
variant for small planes (a 14x14 row fills 14 of 32 lanes).
"""

import os
import sys

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402
from numba import njit  # noqa: E402

import cso  # noqa: E402
from cso.measure import best_times  # noqa: E402
from cso.microkernels.outer_product import build_outer_product_kernel  # noqa: E402
from cso.microkernels.peak import fma_peak_gflops  # noqa: E402
from cso.packing.filters import aligned_empty, pack_filters_panels  # noqa: E402

NF, NWIN = int(sys.argv[1]) if len(sys.argv) > 1 else 14, 32
kernel = build_outer_product_kernel(NF, NWIN, "float32", 16, "windows")


@njit(nogil=True)
def run(xh, C, Hp, Wp, panels, K, R, S, P, Q, y, scratch, nc):
    nf, nwin = NF, NWIN
    ftiles = (K + nf - 1) // nf
    red = C * R * S
    qt = (Q + nwin - 1) // nwin
    for c0 in range(0, C, nc):
        ch = min(nc, C - c0)
        fblock = max(1, 600000 // (ch * R * S * nf * 4))
        for fb in range(0, ftiles, fblock):
            for p in range(P):
                for qi in range(qt):
                    q0 = qi * nwin
                    full_cols = q0 + nwin <= Q
                    for f in range(fb, min(fb + fblock, ftiles)):
                        rows = min(nf, K - f * nf)
                        full = full_cols and rows == nf
                        for r in range(R):
                            for s in range(S):
                                fo = f * red * nf + (c0 * R * S + r * S + s) * nf
                                xo = ((p + r) * C + c0) * Wp + q0 + s
                                # A full tile accumulates in y; an edge tile in scratch,
                                # whose valid part is copied out below.
                                out, out_offset, out_stride = y, f * nf * P * Q + p * Q + q0, P * Q
                                overwrite = c0 == 0 and r == 0 and s == 0
                                if not full:
                                    out, out_offset, out_stride = scratch, 0, nwin
                                    overwrite = r == 0 and s == 0
                                kernel(
                                    ch,
                                    panels,
                                    fo,
                                    R * S * nf,
                                    1,
                                    xh,
                                    xo,
                                    Wp,
                                    out,
                                    out_offset,
                                    out_stride,
                                    panels,
                                    0,
                                    overwrite,
                                    False,
                                )
                        if not full:
                            cols = min(nwin, Q - q0)
                            for i in range(rows):
                                for j in range(cols):
                                    if c0 == 0:
                                        y[(f * nf + i) * P * Q + p * Q + q0 + j] = scratch[
                                            i * nwin + j
                                        ]
                                    else:
                                        y[(f * nf + i) * P * Q + p * Q + q0 + j] += scratch[
                                            i * nwin + j
                                        ]


def to_hcw(x, pad, wp_total):
    n, c, h, w = x.shape
    out = np.zeros((h + 2 * pad, c, wp_total), np.float32)
    out[pad : pad + h, :, pad : pad + w] = x[0].transpose(1, 0, 2)
    return out.reshape(-1)


layers = [
    (64, 56, 64),
    (128, 28, 128),
    (64, 224, 64),
    (128, 112, 128),
    (256, 56, 256),
    (512, 28, 512),
]
peak = fma_peak_gflops()
rng = np.random.default_rng(0)
for C, H, K in layers:
    x = rng.standard_normal((1, C, H, H), dtype=np.float32)
    w = rng.standard_normal((K, C, 3, 3), dtype=np.float32)
    P = Q = H
    qt = -(-Q // NWIN)
    Wp = qt * NWIN + 2
    packedc = cso.pack_filters(w, x.shape, padding=1, threads=1)
    panels = pack_filters_panels(w, 1, NF, np.float32)
    y = np.empty(K * P * Q, np.float32)
    scratch = aligned_empty(NF * NWIN, np.float32)
    nc = packedc.plan.channel_tile

    def direct():
        xh = to_hcw(x, 1, Wp)
        run(xh, C, H + 2, Wp, panels, K, 3, 3, P, Q, y, scratch, nc)

    direct()
    # Against the float64 reference, within the error bound the tests use.
    expected = cso.reference.conv2d(x, w, padding=1)
    bound = cso.reference.conv2d(np.abs(x), np.abs(w), padding=1) * (
        (C * 9 + 3) * np.finfo(np.float32).eps / 2
    )
    correct = bool(np.all(np.abs(y.reshape(expected.shape) - expected) <= bound))
    b = best_times(
        {
            "cso": lambda: cso.conv2d(x, packedc, threads=1),
            "direct": direct,
            "pad": lambda: to_hcw(x, 1, Wp),
        }
    )
    gf = 2 * C * K * 9 * P * Q / 1e9
    plan = packedc.plan
    kernel_name = f"{plan.filters_per_tile}x{plan.windows_per_tile}{plan.vector_operand[0]}"
    print(
        f"3x3 {C}@{H}->{K}: cso packed ({kernel_name}) {gf / b['cso'] / peak:.0%} of peak, "
        f"direct {NF}x{NWIN} {gf / b['direct'] / peak:.0%} (its padded copy "
        f"{b['pad'] / b['direct']:.0%} of it), {'ok' if correct else 'WRONG'}",
        flush=True,
    )
