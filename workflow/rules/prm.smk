# Feedback models: one process reward model per PRM size, trained on automatic step labels
# over completions sampled from the base policies, drawn once for every PRM.


rule prm_samples:
    conda:
        "../../envs/race.yaml"
    input:
        train=rules.data.output.train,
        policies=expand(in_results("base/size~{size}/pre.json"), size=LADDER),
    output:
        record=in_results("prm/samples/samples.json"),
        completions=in_results("prm/samples/completions.jsonl"),
    params:
        job=lambda w: J.to_json(B.prm_samples_job(STUDY)),
    priority: len(LADDER)  # on the way to every PRM: before any other model job
    log:
        "logs/prm/samples.log",
    benchmark:
        "benchmarks/prm/samples.tsv"
    threads: res("prm", "threads")
    resources:
        mem_mb=res("prm", "mem_mb"),
        runtime=res("prm", "runtime"),
        gpu=res("prm", "gpu"),
        slurm_partition=slurm("partition"),
        slurm_account=slurm("account"),
    shell:
        "race prm-samples --job {params.job:q} --threads {threads} > {log:q} 2>&1"


rule prm:
    conda:
        "../../envs/race.yaml"
    input:
        train=rules.data.output.train,
        policies=rules.prm_samples.input.policies,  # the backbone and the tokenizer
        samples=rules.prm_samples.output.record,
    output:
        prm=in_results("prm/size~{prm}/prm.json"),
    params:
        job=lambda w: J.to_json(B.prm_job(STUDY, w.prm)),
    wildcard_constraints:
        prm="|".join(PRMS) or "^$",
    priority: lambda w: larger_first(w.prm)
    log:
        "logs/prm/size~{prm}.log",
    benchmark:
        "benchmarks/prm/size~{prm}.tsv"
    threads: res("prm", "threads")
    resources:
        mem_mb=res("prm", "mem_mb"),
        runtime=res("prm", "runtime"),
        gpu=res("prm", "gpu"),
        slurm_partition=slurm("partition"),
        slurm_account=slurm("account"),
    shell:
        "race prm --job {params.job:q} --threads {threads} > {log:q} 2>&1"
