"""bench.workers' verdicts: issue 21's targets judged from one run's figures."""

from __future__ import annotations

from bench.workers import targets


def _line(text: str, starts: str) -> str:
    return next(line for line in text.splitlines() if line.startswith(f"| {starts}"))


def _results(**bundlefs: float) -> dict[str, dict[str, float]]:
    return {
        "raw": {"find_fresh_s": 0.1, "lslR_warm_s": 0.4},
        "squashfuse_ll": {"cold_1": 1000.0, "cold_2": 2000.0, "cpu_us_1": 200.0},
        "bundlefs-w1": {"cold_4": 1000.0, "cold_8": 1000.0},
        "bundlefs-w2": bundlefs,
    }


def test_a_ratio_target_is_met_only_at_or_above_its_bound():
    met = targets(_results(cold_2=2600.0), "bundlefs-w2")
    assert _line(met, "cold random reads, 2 readers") == (
        "| cold random reads, 2 readers ≥ 1.3× squashfuse_ll | 1.30× | met |"
    )
    missed = targets(_results(cold_2=2500.0), "bundlefs-w2")
    assert _line(missed, "cold random reads, 2 readers").endswith("| 1.25× | missed |")


def test_a_time_target_judges_the_time_against_its_baseline():
    text = targets(_results(find_fresh_s=0.21, lslR_warm_s=0.2), "bundlefs-w2")
    assert _line(text, "find, fresh mount").endswith("| 2.10× | missed |")
    assert _line(text, "ls -lR warm").endswith("| 0.50× | met |")


def test_every_reader_count_of_a_row_must_meet_it():
    text = targets(_results(cold_4=1600.0, cold_8=1400.0), "bundlefs-w2")
    assert _line(text, "… and ≥ 1.5× bundlefs with one worker").endswith(
        "| 1.60× / 1.40× | missed |"
    )


def test_an_absolute_target_shows_its_unit_and_unmeasured_counts_as_a_dash():
    text = targets(_results(cpu_us_1=140.0, cpu_us_4=120.0), "bundlefs-w2")
    assert _line(text, "daemon CPU per cold file, all processes").endswith(
        "| 140 µs / — / 120 µs / — | met |"
    )
    assert _line(text, "DataLoader epoch").endswith("| — | — |")  # nothing measured


def test_the_pip_installed_row_appears_only_when_a_pip_install_was_measured():
    results = _results(warm_fs_1=10_000.0)
    assert "pip-installed" not in targets(results, "bundlefs-w2")
    results["bundlefs-pip-w2"] = {"warm_fs_1": 9_000.0}
    line = _line(targets(results, "bundlefs-w2"), "pip-installed mount (bundlefs-pip-w2)")
    assert line.endswith("| 0.90× / — / — / — / — / — / — / — | met |")


def test_issue_9s_targets_are_judged_again_from_the_same_run():
    results = _results(warm_fs_1=30_000.0, find_warm_s=0.2)
    results["squashfuse_ll"]["warm_fs_1"] = 9_000.0
    results["raw"]["warm_fs_1"] = 50_000.0
    results["raw"]["find_warm_s"] = 0.1
    text = targets(results, "bundlefs-w2")
    assert _line(text, "issue 9, still: warm random reads, cat-style").endswith("| 3.33× | met |")
    assert _line(text, "issue 9, still: … and ≥ 0.7× raw").endswith("| 0.60× | missed |")
    assert _line(text, "issue 9, still: find, warm").endswith("| 2.00× | missed |")
