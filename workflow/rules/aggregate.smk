# The runs tables. RACE's pilot table needs only the pilot rungs' evaluations, so the checkpoint
# (and the validation runs it starts) does not wait for the grid's larger rungs.


rule aggregate_pilot:
    conda:
        "../../envs/race.yaml"
    input:
        evals=pilot_evals,
    output:
        pilot=in_results("race/pilot.csv"),
    params:
        config=STUDY.slice("study", "sizes", "rewards", "allocations", "budgets",
                              "seeds", "race", "eval", "results_dir", "training", "prm"),
    log:
        "logs/aggregate_pilot.log",
    # Ahead of the remaining evaluations: the validation runs it unlocks are the longest jobs.
    priority: 10
    threads: res("aggregate", "threads")
    resources:
        mem_mb=res("aggregate", "mem_mb"),
        runtime=res("aggregate", "runtime"),
    shell:
        "race aggregate --pilot --config {params.config:q} --out {output.pilot:q} > {log:q} 2>&1"


# RACE: rank the pilot (low rungs, one seed), select top-k + baseline per reward x target.
checkpoint select:
    conda:
        "../../envs/race.yaml"
    input:
        pilot=in_results("race/pilot.csv"),
    output:
        selected=in_results("race/selected.json"),
    params:
        top_k=STUDY.race.top_k,
        baseline=STUDY.baseline_alloc(),
        targets=list(STUDY.race_targets),
    log:
        "logs/select.log",
    priority: 10
    threads: res("aggregate", "threads")
    resources:
        mem_mb=res("aggregate", "mem_mb"),
        runtime=res("aggregate", "runtime"),
    shell:
        "race select {input.pilot:q} --top-k {params.top_k} --baseline {params.baseline:q}"
        " --targets {params.targets:q} --out {output.selected:q} > {log:q} 2>&1"


# Everything: base policies, every grid cell x rung, the validation runs.
rule aggregate:
    conda:
        "../../envs/race.yaml"
    input:
        evals=grid_evals,
        base=base_evals,
        validation=validation_evals if RACE_ON else [],
        selected=in_results("race/selected.json") if RACE_ON else [],
    output:
        runs=in_results("runs.csv"),
        stages=in_results("stages.csv"),
    params:
        config=rules.aggregate_pilot.params.config,
        selected=lambda w, input: ["--selected", input.selected] if RACE_ON else [],
    log:
        "logs/aggregate.log",
    threads: res("aggregate", "threads")
    resources:
        mem_mb=res("aggregate", "mem_mb"),
        runtime=res("aggregate", "runtime"),
    shell:
        "race aggregate --config {params.config:q} {params.selected:q} --out {output.runs:q} > {log:q} 2>&1"
