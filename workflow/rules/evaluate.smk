# Every evaluation target with its own eval-FLOP ledger: one job per cell covering all of its
# rungs (as its training job wrote them all), and one per base policy (the budget-0 point of
# each curve). Deleting one rung's eval.json reruns that cell's job and what depends on it.
# MLflow gets the results from the mlflow_log job (or live, with mlflow.live).


rule evaluate:
    conda:
        "../../envs/race.yaml"
    input:
        ledgers=expand(in_run("budget~{budget}/ledger.json"), budget=BUDGETS, allow_missing=True),
        base=BASE_INPUT,
        data=rules.data.output.eval_in,
        prm=EVAL_PRM_INPUT,
    output:
        evals=expand(in_run("budget~{budget}/eval.json"), budget=BUDGETS, allow_missing=True),
    params:
        job=lambda w: J.to_json(B.eval_job(STUDY, cell_of(w))),
    wildcard_constraints:
        seed="|".join(str(s) for s in STUDY.seeds),
    log:
        "logs/runs/size~{size}/reward~{reward}/alloc~{alloc}/seed~{seed}.eval.log",
    benchmark:
        "benchmarks/runs/size~{size}/reward~{reward}/alloc~{alloc}/seed~{seed}.eval.tsv"
    threads: res("evaluate", "threads")
    resources:
        mem_mb=res("evaluate", "mem_mb"),
        runtime=res("evaluate", "runtime"),
        gpu=res("evaluate", "gpu"),
        slurm_partition=slurm("partition"),
        slurm_account=slurm("account"),
    shell:
        "race evaluate --job {params.job:q} --threads {threads} > {log:q} 2>&1"


# A validation-only seed is evaluated at the validation budget alone.
use rule evaluate as evaluate_validation with:
    input:
        ledgers=in_run(f"budget~{VALIDATION_BUDGET}/ledger.json"),
        base=BASE_INPUT,
        data=rules.data.output.eval_in,
        prm=EVAL_PRM_INPUT,
    output:
        evals=in_run(f"budget~{VALIDATION_BUDGET}/eval.json"),
    wildcard_constraints:
        seed="|".join(str(s) for s in EXTRA_SEEDS) or "^$",
    log:
        "logs/runs/size~{size}/reward~{reward}/alloc~{alloc}/seed~{seed}.eval.log",
    benchmark:
        "benchmarks/runs/size~{size}/reward~{reward}/alloc~{alloc}/seed~{seed}.eval.tsv"


rule evaluate_base:
    conda:
        "../../envs/race.yaml"
    input:
        base=base_input,
        data=rules.data.output.eval_in,
        prm=EVAL_PRM_INPUT,
        reward=BASE_REWARD_INPUT,
    output:
        evals=in_results("base/size~{size}/eval.json"),
    params:
        job=lambda w: J.to_json(B.base_eval_job(STUDY, STUDY.unslug(w.size))),
    wildcard_constraints:
        size="|".join(re.escape(C.slug(s)) for s in STUDY.sizes),
    log:
        "logs/base/size~{size}.eval.log",
    benchmark:
        "benchmarks/base/size~{size}.eval.tsv"
    threads: res("evaluate", "threads")
    resources:
        mem_mb=res("evaluate", "mem_mb"),
        runtime=res("evaluate", "runtime"),
        gpu=res("evaluate", "gpu"),
        slurm_partition=slurm("partition"),
        slurm_account=slurm("account"),
    shell:
        "race evaluate --job {params.job:q} --threads {threads} > {log:q} 2>&1"
