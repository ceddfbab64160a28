"""Plan.explain and `python -m cso explain` (no JIT: analysis only)."""

import pytest

import cso
from cso.analysis import detect
from cso.analysis.retile import with_tiles
from cso.explain_cli import main

MACHINE = cso.Hardware(
    l1_bytes=32 * 1024,
    l2_bytes=1 << 20,
    l3_bytes=4 << 20,
    line_bytes=128,
    vector_bytes=64,
    vector_registers=32,
    cores=2,
)


def test_explain_states_every_decision():
    plan = cso.plan_conv2d(
        (1, 64, 56, 56), (64, 64, 3, 3), padding=1, hardware=MACHINE, algorithm="dense"
    )
    text = cso.explain(plan)
    for section in (
        "Hardware",
        "Problem",
        "Tiles",
        "Cache occupancy",
        "Predicted traffic",
        "Choice",
        "Loop nest",
    ):
        assert section in text
    assert "L1 32.0 KiB, L2 1.0 MiB per core; L3 4.0 MiB shared; line 128 B" in text
    assert f"Nc = {plan.channel_tile} channels per tile" in text
    assert f"K2 = {plan.l2_tiles}; K3 = {plan.l3_tiles}" in text
    assert f"micro-kernel {plan.filters_per_tile}x{plan.windows_per_tile}" in text
    other = "IS" if plan.schedule == "WS" else "WS"
    assert f"Choice\n  {plan.schedule}: modelled cost" in text and f"against {other}'s" in text
    # Occupancy percentages are of the real capacities.
    assert "% of 32.0 KiB" in text and "% of 1.0 MiB" in text and "% of 4.0 MiB" in text


def test_explain_says_when_a_schedule_was_forced():
    plan = cso.plan_conv2d(
        (1, 64, 56, 56), (64, 64, 3, 3), padding=1, hardware=MACHINE, algorithm="dense"
    )
    other = "IS" if plan.schedule == "WS" else "WS"
    forced = cso.plan_conv2d(
        (1, 64, 56, 56), (64, 64, 3, 3), padding=1, hardware=MACHINE, schedule=other
    )
    assert "forced" in cso.explain(forced)


def test_with_tiles_recomputes_costs():
    plan = cso.plan_conv2d(
        (1, 32, 20, 20), (48, 32, 3, 3), padding=1, hardware=MACHINE, algorithm="dense"
    )
    changed = with_tiles(plan, schedule="IS", channel_tile=4, l2_tiles=1, l3_tiles=1)
    assert (changed.channel_tile, changed.l2_tiles, changed.l3_tiles) == (4, 1, 1)
    assert dict(changed.tiles_by_schedule)["IS"] == (4, 1, 1)
    assert changed.cost_of("IS").cost > plan.cost_of("IS").cost  # smaller tiles move more
    assert with_tiles(plan, channel_tile=10_000).channel_tile == 32


def test_cli_prints_the_plan(capsys):
    assert (
        main(
            [
                "--input",
                "1,64,56,56",
                "--weight",
                "64,64,3,3",
                "--stride",
                "1",
                "--padding",
                "1",
                "--l1",
                "32K",
                "--l2",
                "1M",
                "--l3",
                "4M",
                "--line",
                "128",
                "--algorithm",
                "dense",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "L1 32.0 KiB, L2 1.0 MiB per core; L3 4.0 MiB shared; line 128 B" in out
    assert "+command line" in out
    assert "Loop nest" in out


def test_cli_explains_the_models_own_choice(capsys):
    # The same layer unforced: the model's family, whichever it is, told.
    argv = ["--input", "1,64,56,56", "--weight", "64,64,3,3", "--padding", "1"]
    assert main(argv) == 0
    chosen = cso.plan_conv2d((1, 64, 56, 56), (64, 64, 3, 3), padding=1)
    assert capsys.readouterr().out.strip() == cso.explain(chosen).strip()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--input", "1,64,56,56", "--weight", "64,64,3,3", "--l2", "lots"], "--l2 must be a size"),
        (["--input", "1,64,56,56", "--weight", "64,32,3,3"], "w.shape[1]"),
        (["--input", "1,64,56,56", "--weight", "64,64,3,3", "--padding", "1,2,3"], "padding"),
    ],
)
def test_cli_errors(capsys, argv, message):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_environment_overrides_detection(monkeypatch):
    detected = detect.stored_or_probed()
    changed = detect.with_environment(detected, {"CSO_L2": "1M", "CSO_LINE": "128"})
    assert changed.l2_bytes == 1 << 20 and changed.line_bytes == 128
    assert changed.source.endswith("+environment")
    assert detect.with_environment(detected, {}) is detected
    with pytest.raises(ValueError, match="CSO_L1 must be a size"):
        detect.with_environment(detected, {"CSO_L1": "big"})
    # What no variable names stays as detected.
    assert changed.l1_bytes == detected.l1_bytes and changed.l3_bytes == detected.l3_bytes
