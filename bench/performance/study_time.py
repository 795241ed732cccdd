"""Where a finished study's seconds went: the jobs' own wall seconds per kind of job, from the
files Snakemake's ``benchmark:`` directive wrote, and the wall-time floor they set on N cores.

    python bench/performance/study_time.py [BENCHMARKS_DIR] [--cores N] [--wall SECONDS]

A job's seconds (the ``s`` column) are its process's wall time, import and start-up included.
Each model job runs on one thread (config ``resources:``), so on N cores the study cannot end
before (sum of job seconds) / N, whatever the schedule; ``--wall`` (e.g. the time ``make run``
printed) adds the share of that floor the scheduler reached. Kinds are read off the paths the
rules write (workflow/rules/): ``base/SIZE.tsv`` pretraining, ``base/SIZE.eval.tsv`` the base
policy's evaluation, ``prm/`` PRM training, ``runs/.../seed~S.tsv`` GRPO training and
``.eval.tsv`` its evaluation; the rest by file name. Prints, never asserts.
"""

import argparse
import csv
import statistics
from collections import defaultdict
from pathlib import Path


def kind_of(path: Path, root: Path) -> str:
    """The kind of job that wrote ``path`` (a benchmark file under ``root``)."""
    parts = path.relative_to(root).parts
    evaluation = path.name.endswith(".eval.tsv")
    if parts[0] == "base":
        return "evaluate (base)" if evaluation else "pretrain"
    if parts[0] == "runs":
        return "evaluate" if evaluation else "train"
    if parts[0] == "prm":
        return "prm"
    return path.stem


def job_seconds(root: Path) -> dict[str, list[float]]:
    """Wall seconds of every job under ``root``, per kind (a file with several rows -- a job
    benchmarked more than once -- counts its last)."""
    seconds: dict[str, list[float]] = defaultdict(list)
    for path in sorted(root.rglob("*.tsv")):
        with path.open() as f:
            rows = list(csv.DictReader(f, delimiter="\t"))
        if rows:
            seconds[kind_of(path, root)].append(float(rows[-1]["s"]))
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("benchmarks", nargs="?", default="benchmarks", type=Path)
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--wall", type=float, help="the study's wall seconds, if known")
    args = parser.parse_args()
    if not args.benchmarks.is_dir():
        raise SystemExit(f"{args.benchmarks}: no such directory (run the study first)")
    seconds = job_seconds(args.benchmarks)
    total = sum(sum(v) for v in seconds.values())
    if not total:
        raise SystemExit(f"{args.benchmarks}: no benchmark rows")
    print(f"{'kind':<16} {'jobs':>5} {'seconds':>8} {'share':>6} {'median':>7} {'max':>6}")
    for kind, v in sorted(seconds.items(), key=lambda kv: -sum(kv[1])):
        print(f"{kind:<16} {len(v):5d} {sum(v):8.0f} {100 * sum(v) / total:5.1f}% "
              f"{statistics.median(v):7.1f} {max(v):6.0f}")
    jobs = sum(len(v) for v in seconds.values())
    floor = total / args.cores
    print(f"{jobs} benchmarked jobs, {total:.0f} job-seconds ({total / 60:.1f} min); floor on "
          f"{args.cores} cores: {floor:.0f} s ({floor / 60:.1f} min)")
    if args.wall:
        print(f"wall {args.wall:.0f} s ({args.wall / 60:.1f} min): the floor is "
              f"{100 * floor / args.wall:.0f}% of it")


if __name__ == "__main__":
    main()
