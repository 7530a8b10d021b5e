"""Medians, ratios and the written outputs: ``docs/benchmarks.md``, ``docs/benchmarks.png`` and
the raw JSON in ``bench-results/``.

Every figure in the tables is the median of the rounds of one run; every ratio compares two
medians from that same run (against the raw directory and against squashfuse_ll). Notes (strings
such as bundlefs's open mode) are shown as they were seen, every distinct value.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.targets import Medians, Verdict, format_value

REPO = Path(__file__).resolve().parents[1]

SYSTEM_ORDER = ("raw", "squashfuse_ll", "ratarmount", "bundlefs")
DATASET_TITLES = {
    "small": "Small files",
    "large": "Large files (sequential)",
    "source": "Source tree (Python stdlib)",
}


@dataclass(frozen=True)
class Metric:
    key: str
    label: str
    fmt: str
    higher_is_better: bool


CAT = "cat-style (os.open/read/close)"
PY = "Python open()"

METRICS: tuple[Metric, ...] = (
    Metric("pack_s", "pack time (s)", "{:,.2f}", False),
    Metric("pack_mbps", "pack throughput (MB/s of source)", "{:,.1f}", True),
    Metric("archive_mb", "archive size (MB)", "{:,.1f}", False),
    Metric("index_bytes_per_file", "index bytes per file", "{:,.1f}", False),
    Metric("mount_ready_ms", "mount ready (ms)", "{:,.1f}", False),
    Metric("find_cold_s", "find, fresh mount + dropped caches (s)", "{:,.3f}", False),
    Metric("find_warm_s", "find, warm (s)", "{:,.3f}", False),
    Metric("du_cold_s", "du -s, fresh mount + dropped caches (s)", "{:,.3f}", False),
    Metric("rand_cold_1_fps", f"random reads cold, 1 reader, {CAT} (files/s)", "{:,.0f}", True),
    Metric("rand_cold_2_fps", f"random reads cold, 2 readers, {CAT} (files/s)", "{:,.0f}", True),
    Metric("rand_warm_1_fps", f"random reads warm, 1 reader, {CAT} (files/s)", "{:,.0f}", True),
    Metric("rand_warm_2_fps", f"random reads warm, 2 readers, {CAT} (files/s)", "{:,.0f}", True),
    Metric("rand_warm_1_mbps", f"random reads warm, 1 reader, {CAT} (MB/s)", "{:,.1f}", True),
    Metric("rand_warm_1_pyopen_fps", f"random reads warm, 1 reader, {PY} (files/s)", "{:,.0f}",
           True),
    Metric("rand_warm_2_pyopen_fps", f"random reads warm, 2 readers, {PY} (files/s)", "{:,.0f}",
           True),
    Metric("cold_cpu_us_per_file", "daemon CPU per file, cold reads, 1 reader (µs)", "{:,.0f}",
           False),
    Metric("rand_cold_1_req_per_file", "FUSE requests per file, cold, 1 reader", "{:,.2f}",
           False),
    Metric("rand_warm_1_req_per_file", f"FUSE requests per file, warm, 1 reader, {CAT}",
           "{:,.2f}", False),
    Metric("rand_warm_1_pyopen_req_per_file", f"FUSE requests per file, warm, 1 reader, {PY}",
           "{:,.2f}", False),
    Metric("seq_cold_mbps", "sequential read cold (MB/s)", "{:,.1f}", True),
    Metric("seq_warm_mbps", "sequential read warm (MB/s)", "{:,.1f}", True),
    Metric("api_cold_1_fps", "Python API reads cold, 1 reader (files/s)", "{:,.0f}", True),
    Metric("api_warm_1_fps", "Python API reads warm, 1 reader (files/s)", "{:,.0f}", True),
    Metric("api_warm_2_fps", "Python API reads warm, 2 readers (files/s)", "{:,.0f}", True),
    Metric("rss_peak_mb", "daemon peak RSS (MB, VmHWM)", "{:,.1f}", False),
    Metric("rss_beyond_cache_mb", "daemon peak RSS beyond configured cache (MB)", "{:,.1f}", False),
)  # fmt: skip

# The bundlefs passes whose FUSE requests are counted per operation (bench.measure), in order.
REQUEST_PASSES = (
    ("rand_cold_1", "cold, 1 reader, cat-style"),
    ("rand_warm_1", "warm, 1 reader, cat-style"),
    ("rand_warm_1_pyopen", "warm, 1 reader, Python open()"),
)
# Operations always shown in the breakdown, even at zero; others only where some pass has any.
REQUEST_OPS = ("lookup", "open", "read", "readdir")


def _ordered(by_dataset: dict[str, Any]) -> list[str]:
    """Datasets in the report's order (JSON round trips sort them alphabetically)."""
    known = [d for d in DATASET_TITLES if d in by_dataset]
    return known + sorted(d for d in by_dataset if d not in DATASET_TITLES)


def logger(tag: str = "") -> Callable[[str], None]:
    """An experiment's progress log: ``[HH:MM:SS] [tag] message`` lines on stderr (stdout is left
    to what an experiment renders)."""
    prefix = f" [{tag}]" if tag else ""

    def log(message: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}]{prefix} {message}", file=sys.stderr, flush=True)

    return log


log = logger()


def median(values: Iterable[float]) -> float:
    """The one median every experiment reports (the mean of the middle two of an even count)."""
    return statistics.median(values)


def medians(samples: dict[str, dict[str, dict[str, list[float]]]]) -> Medians:
    return {
        d: {s: {m: statistics.median(v) for m, v in ms.items() if v} for s, ms in ss.items()}
        for d, ss in samples.items()
    }


def _ratio(a: float | None, b: float | None) -> str:
    if a is None or not b:
        return ""
    return f"{a / b:.2f}×"


def _cell(med: dict[str, dict[str, float]], system: str, metric: Metric) -> str:
    v = med.get(system, {}).get(metric.key)
    if v is None:
        return "—"
    text = metric.fmt.format(v)
    notes = []
    if system != "raw":
        r = _ratio(v, med.get("raw", {}).get(metric.key))
        if r:
            notes.append(f"{r} raw")
    if system != "squashfuse_ll":
        r = _ratio(v, med.get("squashfuse_ll", {}).get(metric.key))
        if r:
            notes.append(f"{r} sq")
    return text + (f" <sub>({', '.join(notes)})</sub>" if notes else "")


def _target_notes(verdicts: list[Verdict], dataset: str, metric: str) -> str:
    """The targets attached to one figure, e.g. '0.19× (≥ 0.5× squashfuse_ll): NOT met'."""
    notes = []
    for v in verdicts:
        t = v.target
        if t.metric == metric and t.dataset in (dataset, "*"):
            status = f"**{v.status}**" if v.met is False else v.status
            notes.append(f"{format_value(v)} ({t.describe()}): {status}")
    return "<br>".join(notes)


def dataset_table(med: Medians, dataset: str, systems: list[str], verdicts: list[Verdict]) -> str:
    dm = med.get(dataset, {})
    cols = [s for s in SYSTEM_ORDER if s in systems and s in dm]
    lines = [
        "| metric | " + " | ".join(cols) + " | bundlefs target |",
        "|---|" + "---:|" * len(cols) + "---|",
    ]
    for metric in METRICS:
        if not any(metric.key in dm.get(s, {}) for s in cols):
            continue
        arrow = "↑" if metric.higher_is_better else "↓"
        row = [f"{metric.label} {arrow}"] + [_cell(dm, s, metric) for s in cols]
        row.append(_target_notes(verdicts, dataset, metric.key))
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def targets_table(verdicts: list[Verdict]) -> str:
    lines = [
        "| target | issue | bundlefs figure | required | status |",
        "|---|---:|---:|---|---|",
    ]
    for v in verdicts:
        t = v.target
        where = "worst dataset" if t.dataset == "*" else t.dataset
        status = f"**{v.status}**" if v.met is False else v.status
        if v.why:
            status += f" ({v.why})"
        lines.append(
            f"| {t.label} ({where}) | {t.issue} | {format_value(v)} | {t.describe()} | {status} |"
        )
    return "\n".join(lines)


def requests_table(med: Medians, dataset: str) -> str | None:
    """bundlefs's FUSE requests per file read, per pass and operation; None if not counted."""
    bm = med.get(dataset, {}).get("bundlefs", {})
    passes = [(p, label) for p, label in REQUEST_PASSES if f"{p}_req_per_file" in bm]
    if not passes:
        return None
    seen = {k.split("_req_", 1)[1].removesuffix("_per_file") for k in bm if "_req_" in k}
    ops = [op for op in REQUEST_OPS if op in seen]
    ops += sorted(
        op
        for op in seen - {"per_file", *REQUEST_OPS}
        if any(bm.get(f"{p}_req_{op}_per_file") for p, _ in passes)
    )
    lines = [
        "| pass | all | " + " | ".join(ops) + " |",
        "|---|---:|" + "---:|" * len(ops),
    ]
    for p, label in passes:
        cells = [f"{bm[f'{p}_req_per_file']:.2f}"]
        for op in ops:
            v = bm.get(f"{p}_req_{op}_per_file")
            cells.append("—" if v is None else f"{v:.2f}")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def note_lines(notes: dict[str, Any], dataset: str | None = None) -> list[str]:
    """'bundlefs open mode: no-open (reason)' for one dataset, or over all datasets."""
    datasets = [dataset] if dataset is not None else _ordered(notes)
    modes: list[str] = []
    for d in datasets:
        bn = notes.get(d, {}).get("bundlefs", {})
        reasons = [r for r in bn.get("open_mode_reason", []) if r]
        for mode in bn.get("open_mode", []):
            text = mode + (f" ({'; '.join(reasons)})" if reasons else "")
            if text not in modes:
                modes.append(text)
    return [f"bundlefs open mode: {' / '.join(modes)}"] if modes else []


def console_summary(
    med: Medians,
    verdicts: list[Verdict],
    systems: list[str],
    notes: dict[str, Any] | None = None,
) -> str:
    out = []
    width = max(len(m.label) for m in METRICS)
    for d in _ordered(med):
        out.append(f"\n== {DATASET_TITLES.get(d, d)} ==")
        dm = med[d]
        cols = [s for s in SYSTEM_ORDER if s in systems and s in dm]
        out.append(f"{'metric':{width}}" + "".join(f"{c:>16}" for c in cols))
        for metric in METRICS:
            if not any(metric.key in dm.get(s, {}) for s in cols):
                continue
            vals = []
            for c in cols:
                v = dm.get(c, {}).get(metric.key)
                vals.append(f"{metric.fmt.format(v):>16}" if v is not None else f"{'—':>16}")
            out.append(f"{metric.label[:width]:{width}}" + "".join(vals))
        out += note_lines(notes or {}, d)
        table = requests_table(med, d)
        if table:
            out += ["bundlefs FUSE requests per file read:", table]
    out.append("\n== targets ==")
    for verdict in verdicts:
        target = verdict.target
        out.append(
            f"  [{verdict.status:7}] {target.label} ({target.dataset}): {format_value(verdict)} "
            f"(need {target.describe()}) {verdict.why}"
        )
    return "\n".join(out)


def write_json(results: dict[str, Any], out_dir: Path, stamp: str) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"results-{stamp}.json"
    text = json.dumps(results, indent=1, sort_keys=True)
    path.write_text(text)
    (out_dir / "latest.json").write_text(text)
    return path


def ensure_matplotlib(log: Any) -> bool:
    """Import matplotlib, installing it into the project venv on first use if it is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        log("installing matplotlib into the project virtualenv (for docs/benchmarks.png)")
        r = subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "matplotlib"],
            capture_output=True,
            text=True,
        )
        if r.returncode != 0:
            log(f"matplotlib install failed, no plot: {r.stderr[-500:]}")
            return False
        import importlib

        importlib.invalidate_caches()
    return True


def plot(med: Medians, systems: list[str], path: Path, title: str) -> bool:
    """Four panels of the headline figures; bars per system, values annotated."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = [s for s in SYSTEM_ORDER if s in systems]
    colors = {"raw": "#888888", "squashfuse_ll": "#1f77b4", "ratarmount": "#ff7f0e",
              "bundlefs": "#2ca02c"}  # fmt: skip
    panels = [
        ("small", ["rand_warm_1_fps", "rand_warm_2_fps", "rand_warm_1_pyopen_fps",
                   "rand_warm_2_pyopen_fps", "rand_cold_1_fps", "rand_cold_2_fps"],
         ["warm 1", "warm 2", "warm 1 open()", "warm 2 open()", "cold 1", "cold 2"],
         "small files: random reads (files/s, log)", True),
        ("small", ["find_cold_s", "find_warm_s", "du_cold_s"], ["find cold", "find warm",
         "du cold"], "small files: metadata walks (s, lower is better)", False),
        ("*", ["pack_mbps"], None, "pack throughput (MB/s of source)", False),
        ("large", ["seq_cold_mbps", "seq_warm_mbps"], ["cold", "warm"],
         "large files: sequential read (MB/s)", False),
    ]  # fmt: skip
    fig, axes = plt.subplots(2, 2, figsize=(13, 8.5))
    for ax, (dataset, metrics, labels, ptitle, log_scale) in zip(axes.flat, panels, strict=True):
        if dataset == "*":
            groups: list[str] = [d for d in ("small", "large", "source") if d in med]
            getter = [(d, metrics[0]) for d in groups]
            labels = groups
        else:
            getter = [(dataset, m) for m in metrics]
        width = 0.8 / max(1, len(cols))
        for i, s in enumerate(cols):
            xs, ys = [], []
            for j, (d, m) in enumerate(getter):
                v = med.get(d, {}).get(s, {}).get(m)
                if v is not None:
                    xs.append(j + (i - (len(cols) - 1) / 2) * width)
                    ys.append(v)
            if not ys:
                continue
            bars = ax.bar(xs, ys, width, label=s, color=colors.get(s))
            for b, y in zip(bars, ys, strict=True):
                txt = f"{y:,.0f}" if y >= 100 else f"{y:.2g}"
                ax.annotate(
                    txt,
                    (b.get_x() + b.get_width() / 2, y),
                    ha="center",
                    va="bottom",
                    fontsize=6,
                    rotation=90,
                    xytext=(0, 2),
                    textcoords="offset points",
                )
        ax.set_xticks(range(len(getter)), labels or [])
        ax.set_title(ptitle, fontsize=10)
        if log_scale:
            ax.set_yscale("log")
        ax.margins(y=0.2)
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def markdown(
    results: dict[str, Any], med: Medians, verdicts: list[Verdict], systems: list[str],
    png_name: str | None,
) -> str:  # fmt: skip
    meta = results["meta"]
    ds = results["datasets"]
    parts = [
        "# bundlefs benchmarks",
        "",
        f"Generated by `python -m bench.run {' '.join(meta['argv'])}`".rstrip() + f" on "
        f"{meta['started']} ({meta['duration_s'] / 60:.1f} min). Machine: {meta['machine']}; "
        f"load average at start {meta['load_start']}, at end {meta['load_end']}. "
        "This machine is shared and noisy: absolute numbers move between runs, ratios against "
        "peers measured in the same run much less. Regenerate with `make bench` (full scale) or "
        "`make bench-quick`.",
        "",
        f"Scale {meta['scale']}, {meta['rounds']} rounds for reads and mounts, "
        f"{meta['pack_rounds']} for packing; every figure is the median over rounds. "
        f"bundlefs daemon cache: {meta['cache_size']}; bundlefs at commit "
        f"`{meta.get('git_head', '?')}`. Systems: {', '.join(systems)}. Raw per-round samples "
        "are in `bench-results/` (gitignored).",
        "",
    ]
    notes = results.get("notes", {})
    for line in note_lines(notes):
        parts += [
            f"{line}. `no-open`: the kernel serves opens and cached reads without asking the "
            "daemon; `open`: every open reaches the daemon.",
            "",
        ]
    parts += [
        "| dataset | files | bytes | files read per pass |",
        "|---|---:|---:|---:|",
    ]
    for name in _ordered(ds):
        d = ds[name]
        parts.append(
            f"| {name} | {d['files']:,} | {d['bytes'] / 1e6:,.1f} MB | {d.get('sample', '—')} |"
        )
    parts += [
        "",
        "## Targets",
        "",
        "Issue 9's read-path targets, then issue 4's targets that are not about reading. Ratios "
        "are bundlefs ÷ reference, medians of the same run.",
        "",
        targets_table(verdicts),
        "",
    ]
    if png_name:
        parts += [f"![benchmark overview]({png_name})", ""]
    parts += [
        "## Results",
        "",
        "Cells: median, then in small print the ratio to the raw directory and to squashfuse_ll "
        "(`sq`) from the same run. ↑ higher is better, ↓ lower is better.",
        "",
    ]
    for d in _ordered(med):
        parts += [
            f"### {DATASET_TITLES.get(d, d)}",
            "",
            dataset_table(med, d, systems, verdicts),
            "",
        ]
        for line in note_lines(notes, d):
            parts += [line + ".", ""]
        table = requests_table(med, d)
        if table:
            parts += [
                "bundlefs FUSE requests per file read, by operation (net of the bench's own "
                "reads of the counters). The daemon counts the operations it implements: the "
                "`FUSE_IOCTL` of Python open()'s `isatty` is answered by libfuse (pyfuse3 has no "
                "ioctl handler) and is not among them.",
                "",
                table,
                "",
            ]
    parts += ["## Method", "", METHOD, ""]
    if results.get("errors"):
        parts += ["## Errors in this run", ""] + [f"- {e}" for e in results["errors"]] + [""]
    return "\n".join(parts)


METHOD = """\
- **Datasets** (seeded, regenerated only when parameters change): *small* — 100,000 × scale
  files in 100 directories, log-normal sizes around 20 KiB clipped to 1 KiB–400 KiB, 80 % random
  bytes (incompressible, like JPEG) and 20 % JSON lines (compressible); *large* — 64 MiB files,
  half random, half text; *source* — a copy of this interpreter's standard library without
  `site-packages` and `__pycache__`.
- **Systems**: *raw* — the source directory itself (the ceiling); *squashfuse_ll* —
  `mksquashfs SRC IMG -comp lz4 -noappend` served by `squashfuse_ll -f`; *ratarmount* — `tar -cf`
  served by `ratarmount -f` from its own virtualenv (its SQLite index is built by a first mount
  and that time is counted as part of packing); *bundlefs* — `bundlefs pack --jobs N` and
  `bundlefs mount --foreground --cache-size C`.
- **Pack**: caches dropped before each pack; throughput is source bytes ÷ wall time. Archive size
  is everything the system needs on disk (ratarmount: tar + index). Index bytes: bundlefs
  `index/data.mdb`; squashfs compressed inode + directory tables; ratarmount's SQLite file.
- **Mount ready**: from spawning the foreground daemon to `os.path.ismount` being true and the
  root being stat-able; median over every mount of the run.
- **find / du**: `find MNT` and `du -s MNT` wall time; *cold* is a fresh mount after
  `echo 3 > /proc/sys/vm/drop_caches`, *warm* a second `find` on the same mount.
- **Random reads**: a fixed shuffled sample of files read whole by 1 reader process or 2 reader
  processes splitting the sample. Cold: fresh mount + dropped caches; warm: the same sample again
  on the same mount. The bytes read are checked against the source. Two readers: *cat-style*
  (`os.open` / `os.read` in 1 MiB reads / `os.close`, the metrics of earlier runs) and, warm only,
  *Python open()* (`open(path, "rb").read()`, which also `fstat`s the file and asks `isatty`: one
  more `FUSE_IOCTL` per file on a FUSE mount).
- **Daemon CPU per cold file**: user + system time of the foreground daemon process (all its
  threads, plus any child processes: libfuse's idle `fusermount3` watcher under `auto_unmount`)
  from `/proc/PID/stat` before and after the cold 1-reader pass, ÷ files read. Clock ticks of
  10 ms, so small samples are coarse.
- **FUSE requests per file** (bundlefs): the per-operation counters of the daemon's
  `user.bundlefs.stats` xattr before and after the cold 1-reader pass and the warm 1-reader passes,
  ÷ files read; the bench's own reads of the counters are measured and subtracted. Omitted for a
  bundlefs without these counters.
- **Sequential**: the large files read whole in 1 MiB reads, cold (fresh mount, dropped caches)
  then warm.
- **Daemon RSS**: `VmHWM` from `/proc/PID/status` of the foreground daemon just before each
  unmount; the worst over the round's mounts. "Beyond cache" subtracts the configured bundlefs
  cache size.
- **Python API**: `bundlefs.Bundle(path).read(rel)` over the same sample in reader processes
  (bundle opened before the clock starts), cold after dropped caches, then warm.
- Before measuring, each system's mount is checked: it serves as many regular files as the source
  and 25 sampled files have identical content.

Caveats when reading the figures:

- The machine is a 2-vCPU VM whose disk is backed by the host's cache: "cold" reads of the raw
  directory are faster than a real cold disk would be, which flatters the raw ceiling and makes
  "cold" mostly mean "the daemon and the kernel start empty".
- bundlefs and ratarmount are Python programs: mount-ready and (at small scale) pack time include
  the interpreter start and imports, which a C daemon does not pay.
- At `--quick` scale, fixed costs weigh more: LMDB's page overhead in index bytes per file, start-up
  in pack throughput. The full-scale run (`make bench`) is the reference for those targets.
- squashfuse_ll runs multi-threaded (libfuse's default); ratarmount and bundlefs serve FUSE from one
  Python thread, with whatever offloading they do themselves.
- "Dropped caches" drops what no process maps. bundlefs holds its index mapped after a mount is
  ready (`--index-resident`, on by default up to 256 MiB), so its cold passes start with the index
  in memory, as on a machine that mounts and then reads; its data is cold like everyone's. The
  mapped index also counts in its peak RSS.
"""


# Sections other bench modules own (bench.torch_epoch, bench.codecs, bench.object_store,
# bench.streaming, bench.delta, bench.diff, bench.writer): each replaces its own, and a full
# `bench.run` rewrite of the page keeps them.
EXTRA_SECTIONS = (
    "## PyTorch: a cold epoch",
    "## Compression: lz4 and zstd",
    "## Object storage",
    "## Streaming: samples and splits",
    "## Versions: issue 26's targets",
    "## Versions: packing on a base",
    "## Diff of two bundles",
    "## Writer: a bundle from Python",
)


def _section_bounds(doc: str, heading: str) -> tuple[int, int] | None:
    start = doc.find("\n" + heading + "\n")
    if start < 0:
        return None
    end = doc.find("\n## ", start + 1)
    return start + 1, end if end >= 0 else len(doc)


def git_head() -> str:
    """The checkout's short commit, for a run's metadata ("unknown" outside git)."""
    done = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    return done.stdout.strip() or "unknown"


def load_average() -> str:
    """The 1, 5 and 15 minute load averages, as a run's metadata records them."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


class RunClock:
    """When a benchmark run started, for its results' ``meta``: made at the start, asked at the
    end (``meta``)."""

    def __init__(self) -> None:
        self.started = dt.datetime.now(dt.UTC)
        self.t0 = time.monotonic()
        self.load_start = load_average()

    def meta(self, **extra: object) -> dict[str, object]:
        """``started``, ``minutes``, ``git_head``, the load at both ends, and ``extra``."""
        return {
            "started": self.started.strftime("%Y-%m-%d %H:%M UTC"),
            "minutes": (time.monotonic() - self.t0) / 60,
            "git_head": git_head(),
            "load_start": self.load_start,
            "load_end": load_average(),
            **extra,
        }


def publish(
    name: str, results: dict[str, Any], text: str, *, docs: bool = True, section: Path | None = None
) -> Path:
    """What every part's ``main`` ends with: ``results`` as ``bench-results/NAME-STAMP.json``,
    ``text`` on stdout and, with ``docs``, as its section of docs/benchmarks.md (or of
    ``section``, another document)."""
    out_dir = REPO / "bench-results"
    out_dir.mkdir(exist_ok=True)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S")
    path = out_dir / f"{name}-{stamp}.json"
    path.write_text(json.dumps(results, indent=2))
    print(text, flush=True)
    if docs:
        doc = section or REPO / "docs" / "benchmarks.md"
        write_section(text, doc)
        print(f"wrote the section to {doc} ({path.name} in bench-results)", file=sys.stderr)
    return path


def write_section(text: str, path: Path) -> None:
    """Replace the section ``text`` heads (its first line, a ``## `` heading) in ``path``, up to
    the next ``## `` heading, or append it."""
    heading = text.split("\n", 1)[0]
    doc = path.read_text() if path.exists() else ""
    bounds = _section_bounds(doc, heading)
    if bounds is None:
        doc = doc.rstrip("\n") + "\n\n" + text.rstrip("\n") + "\n"
    else:
        start, end = bounds
        doc = doc[:start] + text.rstrip("\n") + "\n" + doc[end:]
    path.write_text(doc)


def extra_sections(path: Path) -> list[str]:
    """The other modules' sections now in ``path``, to put back after a rewrite."""
    doc = path.read_text() if path.exists() else ""
    found = []
    for heading in EXTRA_SECTIONS:
        bounds = _section_bounds(doc, heading)
        if bounds is not None:
            found.append(doc[bounds[0] : bounds[1]])
    return found
