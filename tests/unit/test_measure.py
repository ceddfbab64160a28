"""cso.measure's timing of programs in interleaved rounds, on a fake clock."""

import itertools

import pytest

from cso import measure


class FakeClock:
    """``time.perf_counter`` for programs that advance it by set durations."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def program(self, durations):
        """A program whose successive calls take ``durations`` (cycled)."""
        durations = itertools.cycle(durations)

        def run():
            self.now += next(durations)

        return run


@pytest.fixture
def clock(monkeypatch):
    fake = FakeClock()
    monkeypatch.setattr(measure.time, "perf_counter", fake)
    return fake


def test_fast_quarter_times_is_the_mean_of_each_programs_fastest_quarter(clock):
    # 8 rounds: each program's fastest 2 are averaged, whatever their order.
    programs = {
        "a": clock.program([5.0, 1.0, 9.0, 3.0, 2.0, 8.0, 7.0, 6.0]),
        "b": clock.program([4.0, 4.0, 0.5, 4.0, 4.0, 4.0, 1.5, 4.0]),
    }
    times = measure.fast_quarter_times(programs, rounds=8)
    assert times == {"a": pytest.approx(1.5), "b": pytest.approx(1.0)}


def test_fast_quarter_times_runs_at_least_four_rounds_and_every_program_each_round(clock):
    calls = {"a": 0, "b": 0}

    def counted(name):
        def run():
            calls[name] += 1
            clock.now += 1.0

        return run

    times = measure.fast_quarter_times({name: counted(name) for name in calls}, rounds=1)
    assert calls == {"a": 4, "b": 4}
    assert times == {"a": 1.0, "b": 1.0}


def test_fast_quarter_times_goes_on_until_min_seconds_at_most_fifty_rounds(clock):
    calls = []

    def second():
        calls.append(None)
        clock.now += 1.0

    measure.fast_quarter_times({"a": second}, rounds=2, min_seconds=10.5)
    assert len(calls) == 11  # the 11th round ends past 10.5 seconds
    calls.clear()
    measure.fast_quarter_times({"a": lambda: calls.append(None)}, rounds=2, min_seconds=1e9)
    assert len(calls) == 50  # the clock never moves: the cap stops it


def test_paired_ratios_are_medians_of_each_rounds_ratio_to_the_reference():
    # The machine slows down tenfold in the third round: a ratio taken within
    # each round does not see it; the median drops the odd round out.
    samples = {"model": [1.0, 1.0, 10.0, 1.0], "forced": [0.5, 0.5, 10.0, 0.4]}
    ratios = measure.paired_ratios(samples, "model")
    assert ratios["model"] == 1.0
    assert ratios["forced"] == pytest.approx(2.0)  # median of 2, 2, 1, 2.5
    assert measure.paired_ratios({"a": [2.0, 4.0, 8.0], "b": [4.0, 8.0, 16.0]}, "a")["b"] == 0.5


def test_paired_difference_is_the_median_relative_difference_at_the_best_round(clock):
    # The machine runs twice as slow in rounds 2 and 4: each round's ratio is
    # taken at one speed (1.1, 1.1, 1.1, 1.1, 1.15), its median (1.1) scaled
    # by the best round of the second program (10).
    programs = {
        "call": clock.program([11.0, 22.0, 11.0, 22.0, 11.5]),
        "packed": clock.program([10.0, 20.0, 10.0, 20.0, 10.0]),
    }
    assert measure.paired_difference(programs, "call", "packed", rounds=5) == pytest.approx(1.0)


def test_timed_rounds_yields_every_call_in_round_times_order(clock):
    # Each round runs every program once; round_times' samples are these
    # calls grouped by program, in the same seeded order.
    programs = {
        name: clock.program([seconds]) for name, seconds in (("a", 1.0), ("b", 2.0), ("c", 4.0))
    }
    calls = list(measure.timed_rounds(programs, rounds=3))
    assert [index for index, _, _ in calls] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    for index in range(3):
        assert sorted(name for i, name, _ in calls if i == index) == ["a", "b", "c"]
    assert all(seconds == {"a": 1.0, "b": 2.0, "c": 4.0}[name] for _, name, seconds in calls)
    grouped = {name: [s for _, n, s in calls if n == name] for name in programs}
    assert measure.round_times(programs, rounds=3) == grouped
