# The runs tables: the grid (what the pilot ranks) and everything (grid + validation runs).


rule aggregate_grid:
    conda:
        "../../envs/race.yaml"
    input:
        evals=grid_evals,
        base=base_evals,
    output:
        RD + "grid.csv",
        RD + "grid_stages.csv",
    params:
        race=RACE,
        config=S.config_slice(STUDY, "study", "sizes", "rewards", "allocations", "budgets",
                              "seeds", "race", "eval", "results_dir", "training", "prm"),
    log:
        "logs/aggregate_grid.log",
    resources:
        mem_mb=res("aggregate", "mem_mb", 1000),
        runtime=res("aggregate", "runtime", 10),
    shell:
        "{params.race} aggregate --config {params.config:q} --out {output[0]} > {log} 2>&1"


# RACE: rank the pilot (low rungs, one seed), select top-k + baseline per reward x target.
checkpoint select:
    conda:
        "../../envs/race.yaml"
    input:
        RD + "grid_stages.csv",
    output:
        RD + "race/selected.json",
    params:
        race=RACE,
        top_k=STUDY["race"]["top_k"],
        baseline=S.baseline_alloc(STUDY),
        targets=" ".join(S.race_targets(STUDY)),
    log:
        "logs/select.log",
    resources:
        mem_mb=res("aggregate", "mem_mb", 1000),
        runtime=res("aggregate", "runtime", 10),
    shell:
        "{params.race} select {input} --top-k {params.top_k} --baseline {params.baseline}"
        " --targets {params.targets} --out {output[0]} > {log} 2>&1"


rule aggregate:
    conda:
        "../../envs/race.yaml"
    input:
        grid=RD + "grid.csv",
        evals=validation_evals if RACE_ON else [],
        selected=RD + "race/selected.json" if RACE_ON else [],
    output:
        RD + "runs.csv",
        RD + "stages.csv",
    params:
        race=RACE,
        config=rules.aggregate_grid.params.config,
        selected="--selected " + RD + "race/selected.json" if RACE_ON else "",
    log:
        "logs/aggregate.log",
    resources:
        mem_mb=res("aggregate", "mem_mb", 1000),
        runtime=res("aggregate", "runtime", 10),
    shell:
        "{params.race} aggregate --config {params.config:q} {params.selected} --out {output[0]} > {log} 2>&1"
