# Every evaluation target with its own eval-FLOP ledger, per cell x budget rung (and for
# every base policy: the budget-0 point of each curve). MLflow gets the results from the
# mlflow_log job: an evaluation job never starts MLflow.


rule evaluate:
    conda:
        "../../envs/race.yaml"
    input:
        ledger=in_run("budget~{budget}/ledger.json"),
        base=base_input,
        data=rules.data.output.eval_in,
        prm=EVAL_PRM_INPUT,
    output:
        in_run("budget~{budget}/eval.json"),
    params:
        race=RACE_MODEL,
        data=lambda w, input: os.path.dirname(input.data),
        config=S.config_slice(STUDY, "eval", "study"),
        policy=lambda w: S.base_dir(STUDY, S.unslug(STUDY, w.size)),
        reward=lambda w: json.dumps(S.reward_spec(STUDY, w.reward), sort_keys=True),
        prm=EVAL_PRM_ARG,
        adapter=lambda w, input: os.path.dirname(input.ledger),
        temperature=lambda w: S.allocation(STUDY, w.alloc).temperature,
    log:
        "logs/runs/size~{size}/reward~{reward}/alloc~{alloc}/seed~{seed}/budget~{budget}.eval.log",
    benchmark:
        "benchmarks/runs/size~{size}/reward~{reward}/alloc~{alloc}/seed~{seed}/budget~{budget}.eval.tsv"
    threads: 1
    resources:
        mem_mb=res("evaluate", "mem_mb", 2000),
        runtime=res("evaluate", "runtime", 30),
        gpus=res("evaluate", "gpus", 0),
    shell:
        "{params.race} evaluate --policy {params.policy} --adapter {params.adapter}"
        " --data {params.data} --out {output} --config {params.config:q}"
        " --reward-json {params.reward:q} {params.prm}"
        " --train-temperature {params.temperature}"
        " > {log} 2>&1"


rule evaluate_base:
    conda:
        "../../envs/race.yaml"
    input:
        base=in_results("base/size~{size}/pre.json"),
        data=rules.data.output.eval_in,
        prm=EVAL_PRM_INPUT,
    output:
        in_results("base/size~{size}/eval.json"),
    params:
        race=RACE_MODEL,
        data=lambda w, input: os.path.dirname(input.data),
        policy=lambda w, input: os.path.dirname(input.base),
        config=S.config_slice(STUDY, "eval", "study"),
        temperature=STUDY["training"]["temperature"],
        reward=json.dumps(S.reward_spec(STUDY, next(iter(STUDY["rewards"]))), sort_keys=True),
        prm=EVAL_PRM_ARG,
    wildcard_constraints:
        size="|".join(LADDER) or "^$",
    log:
        "logs/base/size~{size}.eval.log",
    benchmark:
        "benchmarks/base/size~{size}.eval.tsv"
    threads: 1
    resources:
        mem_mb=res("evaluate", "mem_mb", 2000),
        runtime=res("evaluate", "runtime", 30),
    shell:
        "{params.race} evaluate --policy {params.policy} --data {params.data} --out {output}"
        " --config {params.config:q} --reward-json {params.reward:q} {params.prm}"
        " --train-temperature {params.temperature} > {log} 2>&1"
