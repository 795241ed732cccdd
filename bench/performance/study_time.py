"""Where a finished study's seconds went: the jobs' own wall seconds per kind of job, from the
files Snakemake's ``benchmark:`` directive wrote, and the wall-time floor they set on N cores.

    python bench/performance/study_time.py [BENCHMARKS_DIR] [--cores N] [--wall SECONDS]
        [--workdir DIR] [--results RESULTS_DIR]

A job's seconds (the ``s`` column) are its process's wall time, import and start-up included.
Each model job runs on one thread (config ``resources:``), so on N cores the study cannot end
before (sum of job seconds) / N, whatever the schedule; ``--wall`` (e.g. the time ``make run``
printed) adds the share of that floor the scheduler reached. Kinds are read off the paths the
rules write (workflow/rules/): ``base/SIZE.tsv`` pretraining, ``base/SIZE.eval.tsv`` the base
policy's evaluation, ``prm/`` PRM training, ``runs/.../seed~S.tsv`` GRPO training and
``.eval.tsv`` its evaluation; the rest by file name.

Then the longest dependency chain: on any number of cores the study cannot end before its
jobs' longest path through the DAG (pretraining -> PRM sampling -> PRM training -> a
PRM-reward cell's training and evaluation, typically). It is read from Snakemake's own job
records (``.snakemake/metadata`` under ``--workdir``: each output's rule, input files, start
and end time), so it is the DAG the study really ran; ``--results`` keeps the outputs of one
study (a workdir's records hold every study run there). Prints, never asserts.
"""

import argparse
import base64
import csv
import json
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


def job_records(workdir: Path, results: str) -> list[dict]:
    """One record per job that wrote an output under ``results`` (``rule``, ``outputs``,
    ``inputs``, ``seconds``), from Snakemake's metadata: a job's outputs share its rule and
    job hash; its seconds run from the first output's start to the last one's end."""
    jobs: dict[tuple, dict] = {}
    for path in sorted((workdir / ".snakemake" / "metadata").iterdir()):
        output = base64.urlsafe_b64decode(path.name + "=" * (-len(path.name) % 4)).decode()
        record = json.loads(path.read_text())
        if not output.startswith(results.rstrip("/") + "/") or record.get("incomplete"):
            continue
        start, end = record.get("starttime"), record.get("endtime")
        if start is None or end is None:
            continue
        job = jobs.setdefault((record["rule"], record.get("job_hash")), {
            "rule": record["rule"], "outputs": [], "inputs": set(record.get("input", [])),
            "start": start, "end": end})
        job["outputs"].append(output)
        job["start"], job["end"] = min(job["start"], start), max(job["end"], end)
    for job in jobs.values():
        job["seconds"] = job["end"] - job["start"]
    return list(jobs.values())


def longest_chain(jobs: list[dict]) -> tuple[float, list[dict]]:
    """The path through the jobs' DAG (an input another job wrote is an edge) with the most
    job seconds, and its jobs in order."""
    producer = {out: i for i, job in enumerate(jobs) for out in job["outputs"]}

    def parents(i: int) -> set[int]:
        found = set()
        for name in jobs[i]["inputs"]:
            # An input folder is written by the job that wrote a file in it, or itself.
            hits = [producer[name]] if name in producer else [
                j for out, j in producer.items() if out.startswith(name.rstrip("/") + "/")]
            found.update(j for j in hits if j != i)
        return found

    best: dict[int, tuple[float, int | None]] = {}

    def finish(i: int) -> float:
        if i not in best:
            best[i] = (jobs[i]["seconds"], None)
            for j in parents(i):
                if finish(j) + jobs[i]["seconds"] > best[i][0]:
                    best[i] = (finish(j) + jobs[i]["seconds"], j)
        return best[i][0]

    end = max(range(len(jobs)), key=finish)
    chain, i = [], end
    while i is not None:
        chain.append(jobs[i])
        i = best[i][1]
    return best[end][0], chain[::-1]


def job_name(job: dict) -> str:
    """A job as its first output's folder names it (rule and path, shortened)."""
    return f"{job['rule']} ({Path(sorted(job['outputs'])[0]).parent})"


def print_chain(workdir: Path, results: str, floor: float, cores: int) -> None:
    jobs = job_records(workdir, results)
    if not jobs:
        print(f"no Snakemake job records for {results}/ under {workdir}/.snakemake/metadata")
        return
    seconds, chain = longest_chain(jobs)
    print(f"\nlongest dependency chain ({len(chain)} jobs of {len(jobs)}, Snakemake's records "
          f"under {workdir}/.snakemake): {seconds:.0f} s ({seconds / 60:.1f} min)")
    for job in chain:
        print(f"  {job['seconds']:7.0f} s  {job_name(job)}")
    print(f"the study ends no sooner than max(floor on {cores} cores {floor:.0f} s, chain "
          f"{seconds:.0f} s) = {max(floor, seconds):.0f} s; on many cores, the chain")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("benchmarks", nargs="?", type=Path,
                        help="the study's benchmark folder (default: benchmarks/ in --workdir)")
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--wall", type=float, help="the study's wall seconds, if known")
    parser.add_argument("--workdir", type=Path, default=Path("."),
                        help="where the study ran (its .snakemake/)")
    parser.add_argument("--results", default="results", help="the study's results_dir")
    args = parser.parse_args()
    args.benchmarks = args.benchmarks or args.workdir / "benchmarks"
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
    print_chain(args.workdir, args.results, floor, args.cores)


if __name__ == "__main__":
    main()
