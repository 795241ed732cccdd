# The runs tables: the grid (what the pilot ranks) and everything (grid + validation runs).


rule aggregate_grid:
    input:
        evals=grid_evals,
        base=base_evals,
    output:
        R + "/grid.csv",
        R + "/grid_stages.csv",
    params:
        config=S.config_slice(STUDY, "study", "sizes", "rewards", "allocations", "budgets",
                              "seeds", "race", "eval", "results_dir", "training", "prm"),
    log:
        "logs/aggregate_grid.log",
    resources:
        mem_mb=res("aggregate", "mem_mb", 1000),
        runtime=res("aggregate", "runtime", 10),
    shell:
        "{RACE} aggregate --config {params.config:q} --out {output} > {log} 2>&1"


# RACE: rank the pilot (low rungs, one seed), select top-k + baseline per reward x target.
checkpoint select:
    input:
        R + "/grid_stages.csv",
    output:
        R + "/race/selected.json",
    params:
        top_k=STUDY["race"]["top_k"],
        baseline=S.baseline_alloc(STUDY),
        targets=" ".join(S.race_targets(STUDY)),
    log:
        "logs/select.log",
    resources:
        mem_mb=res("aggregate", "mem_mb", 1000),
        runtime=res("aggregate", "runtime", 10),
    shell:
        "{RACE} select {input} --top-k {params.top_k} --baseline {params.baseline}"
        " --targets {params.targets} --out {output} > {log} 2>&1"


rule aggregate:
    input:
        grid=R + "/grid.csv",
        evals=validation_evals if RACE_ON else [],
        selected=R + "/race/selected.json" if RACE_ON else [],
    output:
        R + "/runs.csv",
        R + "/stages.csv",
    params:
        config=rules.aggregate_grid.params.config,
        selected="--selected " + R + "/race/selected.json" if RACE_ON else "",
    log:
        "logs/aggregate.log",
    resources:
        mem_mb=res("aggregate", "mem_mb", 1000),
        runtime=res("aggregate", "runtime", 10),
    shell:
        "{RACE} aggregate --config {params.config:q} {params.selected} --out {output} > {log} 2>&1"
