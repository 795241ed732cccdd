"""Reading a Snakemake dry run: the jobs it would run, per rule (used by the workflow tests)."""

from __future__ import annotations


def job_counts(plan: str) -> dict[str, int]:
    """The 'Job stats' table of ``snakemake -n`` output as ``{rule: count}`` (no total);
    empty when there is nothing to be done."""
    if "Job stats:" not in plan:
        return {}
    lines = plan.split("Job stats:")[1].splitlines()
    counts = {}
    for line in lines[3:]:  # after the header "job  count" and its rule
        parts = line.split()
        if len(parts) != 2 or not parts[1].isdigit():
            break  # the table ends at its first non-row line
        if parts[0] != "total":
            counts[parts[0]] = int(parts[1])
    return counts
