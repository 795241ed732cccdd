# One metered GRPO run per cell (size x reward x allocation x seed). Each run passes every
# nested budget rung and writes a snapshot + ledger there; one run serves all rungs.


rule train:
    conda:
        "../../envs/race.yaml"
    input:
        base=BASE_INPUT,
        data=rules.data.output.train,
        reward=REWARD_INPUT,
        mlflow=MLFLOW_INPUT,
    output:
        rungs=expand(in_run("budget~{budget}/ledger.json"), budget=BUDGETS, allow_missing=True),
        done=in_run("DONE"),
    params:
        job=lambda w: J.params_json("train", B.train_job(STUDY, cell_of(w))),
    wildcard_constraints:
        seed="|".join(str(s) for s in STUDY.seeds),
    log:
        "logs/runs/size~{size}/reward~{reward}/alloc~{alloc}/seed~{seed}.log",
    benchmark:
        "benchmarks/runs/size~{size}/reward~{reward}/alloc~{alloc}/seed~{seed}.tsv"
    threads: res("train", "threads")
    resources:
        mem_mb=res("train", "mem_mb"),
        runtime=res("train", "runtime"),
        gpu=res("train", "gpu"),
        slurm_partition=slurm("partition"),
        slurm_account=slurm("account"),
    shell:
        "race train --job {params.job:q} --run-options \"$RACE_TRAIN_RUN_OPTIONS\""
        " --threads {threads} > {log:q} 2>&1"


# Validation runs of the configs the pilot selected, for the seeds the grid does not run;
# they stop at the validation budget.
use rule train as train_validation with:
    output:
        rungs=expand(
            in_run("budget~{budget}/ledger.json"),
            budget=[b for b in BUDGETS if float(b) <= float(VALIDATION_BUDGET)],
            allow_missing=True,
        ),
        done=in_run("DONE"),
    wildcard_constraints:
        seed="|".join(str(s) for s in EXTRA_SEEDS) or "^$",
    log:
        "logs/runs/size~{size}/reward~{reward}/alloc~{alloc}/seed~{seed}.log",
    benchmark:
        "benchmarks/runs/size~{size}/reward~{reward}/alloc~{alloc}/seed~{seed}.tsv"
