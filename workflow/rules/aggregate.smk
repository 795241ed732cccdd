# The runs tables: the grid (what the pilot ranks) and everything (grid + validation runs).


rule aggregate_grid:
    conda:
        "../../envs/race.yaml"
    input:
        evals=grid_evals,
        base=base_evals,
    output:
        grid=in_results("grid.csv"),
        grid_stages=in_results("grid_stages.csv"),
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
        "{params.race} aggregate --config {params.config:q} --out {output.grid} > {log} 2>&1"


# RACE: rank the pilot (low rungs, one seed), select top-k + baseline per reward x target.
checkpoint select:
    conda:
        "../../envs/race.yaml"
    input:
        grid_stages=in_results("grid_stages.csv"),
    output:
        selected=in_results("race/selected.json"),
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
        "{params.race} select {input.grid_stages} --top-k {params.top_k} --baseline {params.baseline}"
        " --targets {params.targets} --out {output.selected} > {log} 2>&1"


rule aggregate:
    conda:
        "../../envs/race.yaml"
    input:
        grid=in_results("grid.csv"),
        evals=validation_evals if RACE_ON else [],
        selected=in_results("race/selected.json") if RACE_ON else [],
    output:
        runs=in_results("runs.csv"),
        stages=in_results("stages.csv"),
    params:
        race=RACE,
        config=rules.aggregate_grid.params.config,
        selected=lambda w, input: f"--selected {input.selected}" if RACE_ON else "",
    log:
        "logs/aggregate.log",
    resources:
        mem_mb=res("aggregate", "mem_mb", 1000),
        runtime=res("aggregate", "runtime", 10),
    shell:
        "{params.race} aggregate --config {params.config:q} {params.selected} --out {output.runs} > {log} 2>&1"
