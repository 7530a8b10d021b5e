"""bench.compare: the before/after verdict is normalised by a reference measured in the same run."""

from __future__ import annotations

from bench.compare import compare


def _run(bundlefs: list[float], raw: list[float]) -> dict:
    return {
        "samples": {
            "small": {
                "bundlefs": {"rand_warm_1_fps": bundlefs},
                "raw": {"rand_warm_1_fps": raw},
            }
        }
    }


def _verdict(lines: list[str]) -> str:
    return lines[-1].rsplit("|", 2)[-2].strip()


def test_a_slower_host_is_not_a_regression_when_the_reference_slowed_as_much():
    lines, worse = compare(
        _run([100, 101, 102], [200, 201, 202]), _run([70, 71, 72], [140, 141, 142])
    )
    assert worse == 0 and _verdict(lines) == "same"


def test_a_figure_worse_as_measured_and_as_normalised_with_apart_samples_is_a_regression():
    lines, worse = compare(
        _run([100, 101, 102], [200, 201, 202]), _run([70, 71, 72], [200, 201, 202])
    )
    assert worse == 1 and _verdict(lines) == "**worse**"


def test_overlapping_samples_are_noise_whatever_the_medians_say():
    lines, worse = compare(
        _run([60, 100, 140], [200, 200, 200]), _run([55, 80, 141], [200, 200, 200])
    )
    assert worse == 0 and _verdict(lines) == "same"


def test_a_clear_gain_is_reported_as_better():
    lines, worse = compare(
        _run([100, 101, 102], [200, 201, 202]), _run([150, 151, 152], [200, 201, 202])
    )
    assert worse == 0 and _verdict(lines) == "better"
