"""The targets and their evaluation against the medians of one run: issue 9's read-path targets
(random reads cat-style and through Python's ``open()``, find, sequential reads, the Python API,
daemon CPU per cold file) plus issue 4's targets that are not about reading (pack, mount ready,
daemon memory, index size).

A target compares a median of bundlefs with either a fixed bound or the median of another
system (or of another bundlefs metric) from the same run. Ratios are always taken from the
same run: absolute numbers on this shared 2-core machine drift, ratios much less so.
"""

from __future__ import annotations

from dataclasses import dataclass

Medians = dict[str, dict[str, dict[str, float]]]  # dataset -> system -> metric -> median


@dataclass(frozen=True)
class Target:
    key: str
    label: str
    dataset: str
    metric: str
    # Reference: another system's value of ``ref_metric`` (default: the same metric), or a
    # fixed bound when ``ref_system`` is None.
    ref_system: str | None
    bound: float
    higher_is_better: bool
    ref_metric: str | None = None
    system: str = "bundlefs"
    unit: str = ""
    issue: int = 9  # the issue that set the target

    def describe(self) -> str:
        op = "≥" if self.higher_is_better else "≤"
        if self.ref_system is None:
            return f"{op} {self.bound:g}{self.unit}"
        ref = self.ref_system if self.ref_metric is None else f"{self.ref_system} {self.ref_metric}"
        return f"{op} {self.bound:g}× {ref}"


@dataclass
class Verdict:
    target: Target
    value: float | None  # the ratio (or the absolute value for fixed bounds)
    met: bool | None  # None: could not be evaluated (a system or metric is missing)
    why: str = ""

    @property
    def status(self) -> str:
        return {True: "met", False: "NOT met", None: "n/a"}[self.met]


TARGETS: tuple[Target, ...] = (
    # Issue 9: the read path. "cat-style" is os.open/os.read/os.close (the metrics kept their
    # issue-4 names); "Python open()" is open(path, "rb").read(), one FUSE_IOCTL more per file.
    Target("warm_cat_vs_sq_1", "warm random reads, cat-style, 1 reader", "small",
           "rand_warm_1_fps", "squashfuse_ll", 3.0, True),
    Target("warm_cat_vs_raw_1", "warm random reads, cat-style, 1 reader", "small",
           "rand_warm_1_fps", "raw", 0.7, True),
    Target("warm_py_vs_sq_1", "warm random reads, Python open(), 1 reader", "small",
           "rand_warm_1_pyopen_fps", "squashfuse_ll", 1.0, True),
    Target("warm_py_vs_sq_2", "warm random reads, Python open(), 2 readers", "small",
           "rand_warm_2_pyopen_fps", "squashfuse_ll", 1.0, True),
    Target("cold_vs_sq_1", "cold random reads, 1 reader (stretch goal 1.5×)", "small",
           "rand_cold_1_fps", "squashfuse_ll", 1.2, True),
    Target("cold_scaling", "cold random reads, 2 readers vs 1", "small", "rand_cold_2_fps",
           "bundlefs", 1.3, True, ref_metric="rand_cold_1_fps"),
    Target("find_cold", "find over the whole mount (fresh mount)", "small", "find_cold_s",
           "raw", 2.0, False),
    Target("find_warm", "find over the whole mount (warm)", "small", "find_warm_s",
           "raw", 1.5, False),
    Target("seq_cold", "sequential read of large files, cold", "large", "seq_cold_mbps",
           "squashfuse_ll", 1.0, True),
    Target("seq_warm", "sequential read of large files, warm", "large", "seq_warm_mbps",
           "squashfuse_ll", 1.0, True),
    Target("api_warm", "Python API random whole-file reads vs raw dir warm (1 reader)", "small",
           "api_warm_1_fps", "raw", 0.4, True, ref_metric="rand_warm_1_fps"),
    Target("cold_cpu", "daemon CPU per file, cold random reads (1 reader)", "small",
           "cold_cpu_us_per_file", None, 150.0, False, unit=" µs"),
    # Issue 4, not about reading: kept as they were.
    Target("pack_small", "pack throughput, small files", "small", "pack_mbps",
           "squashfuse_ll", 1.0, True, issue=4),
    Target("pack_large", "pack throughput, large files", "large", "pack_mbps",
           "squashfuse_ll", 1.0, True, issue=4),
    Target("mount_ready", "mount ready", "small", "mount_ready_ms", None, 200.0, False,
           unit=" ms", issue=4),
    Target("rss", "daemon peak RSS beyond configured cache", "*",
           "rss_beyond_cache_mb", None, 40.0, False, unit=" MB", issue=4),
    Target("index", "index bytes per file", "small", "index_bytes_per_file", None, 60.0, False,
           unit=" B", issue=4),
)  # fmt: skip


def _get(med: Medians, dataset: str, system: str, metric: str) -> float | None:
    if dataset == "*":  # worst case over all datasets
        vals = [m[system][metric] for m in med.values() if metric in m.get(system, {})]
        return max(vals) if vals else None
    return med.get(dataset, {}).get(system, {}).get(metric)


def evaluate(med: Medians) -> list[Verdict]:
    out = []
    for t in TARGETS:
        v = _get(med, t.dataset, t.system, t.metric)
        if v is None:
            out.append(Verdict(t, None, None, f"no {t.system} {t.metric}"))
            continue
        if t.ref_system is None:
            value = v
        else:
            ref = _get(med, t.dataset, t.ref_system, t.ref_metric or t.metric)
            if not ref:
                out.append(Verdict(t, None, None, f"no {t.ref_system} reference"))
                continue
            value = v / ref
        met = value >= t.bound if t.higher_is_better else value <= t.bound
        out.append(Verdict(t, value, met))
    return out


def format_value(v: Verdict) -> str:
    if v.value is None:
        return "—"
    if v.target.ref_system is None:
        return f"{v.value:,.1f}{v.target.unit}"
    return f"{v.value:.2f}×"
