"""How steady is a small difference of two times, by estimator?

    python experiments/difference_estimators.py [--shapes 8x48,14x32] [--samples 16]

The calibration's in-place probe (:func:`cso.calibrate.in_place_probes.in_place_filter_seconds`)
times a window-vectorised plan reading its filters in place and the same
plan on filters packed ahead, and divides the difference by the filter
reads: 0-4% of a 1.5 ms layer.  Each shape's difference is sampled
``--samples`` times, alternately by three estimators: the difference of each
plan's best round (:func:`cso.measure.best_times`), of the means of each
plan's fastest quarter of rounds (:func:`cso.measure.fast_quarter_times`),
and the median of the two plans' differences within each round
(:func:`cso.measure.paired_difference`).  Prints every sample (ps per read), and each
estimator's median and standard deviation: the steadier one moves the plans
less from one calibration to the next.  One thread, default weights.
"""

from __future__ import annotations

import statistics
from dataclasses import replace

import harness  # noqa: F401

from cso.analysis.detect import stored_or_probed  # noqa: E402
from cso.analysis.weights import DEFAULT_WEIGHTS  # noqa: E402
from cso.calibrate import in_place_probes  # noqa: E402
from cso.measure import best_times, fast_quarter_times, paired_difference  # noqa: E402


def paired_rounds(programs, rounds, min_seconds):
    """``{"call": d, "packed": 0}``: the median of the per-round differences
    (:func:`cso.measure.paired_difference`), in the estimators' form."""
    difference = paired_difference(programs, "call", "packed", rounds, min_seconds)
    return {"call": difference, "packed": 0.0}


ESTIMATORS = {
    "best rounds": best_times,
    "fastest quarters": fast_quarter_times,
    "paired rounds": paired_rounds,
}


def main():
    parser = harness.parser(__doc__)
    parser.add_argument("--shapes", default="8x48,14x32", help="Nf x Nwin, comma-separated")
    parser.add_argument("--samples", type=int, default=16)
    args = parser.parse_args()
    hardware = replace(stored_or_probed(), weights=DEFAULT_WEIGHTS)
    for text in args.shapes.split(","):
        shape = tuple(int(part) for part in text.split("x"))
        samples = {name: [] for name in ESTIMATORS}
        for _ in range(args.samples):
            for name, times in ESTIMATORS.items():
                seconds = in_place_probes.in_place_filter_seconds(hardware, shape, 7, times)
                samples[name].append(seconds * 1e12)
        print(f"{text}w, ps per filter element read in place:")
        for name, values in samples.items():
            shown = " ".join(f"{value:.1f}" for value in values)
            print(
                f"  {name:<17} median {statistics.median(values):5.2f}, standard deviation "
                f"{statistics.stdev(values):5.2f}: {shown}"
            )


if __name__ == "__main__":
    main()
