"""The benchmark's CSV holds every layer's columns, whatever its family."""

import csv

from cso.bench import write_csv


def test_rows_with_different_stages_share_one_csv(tmp_path):
    # A row-plan layer has no output unpacking stage; a lane-plan layer has one
    # (python -m cso bench --breakdown --csv failed on EfficientNet-B0 so).
    rows = [
        {"layer": "dw 3x3 32 @112", "stage_kernel_ms": 0.5},
        {"layer": "dw 5x5 1152 @7", "stage_kernel_ms": 0.2, "stage_output unpacking_ms": 0.1},
    ]
    path = tmp_path / "rows.csv"
    write_csv(rows, path)
    with open(path, newline="") as handle:
        read = list(csv.DictReader(handle))
    assert list(read[0]) == ["layer", "stage_kernel_ms", "stage_output unpacking_ms"]
    assert read[0]["stage_output unpacking_ms"] == ""
    assert read[1]["stage_output unpacking_ms"] == "0.1"
    assert [row["layer"] for row in read] == ["dw 3x3 32 @112", "dw 5x5 1152 @7"]
