# Base policies: SFT "pretraining" of every ladder size (hub / path sizes need none).


rule base:
    conda:
        "../../envs/race.yaml"
    input:
        train=rules.data.output.train,
        eval_in=rules.data.output.eval_in,
        tokenizer=rules.tokenizer.output,
    output:
        pre=in_results("base/size~{size}/pre.json"),
    params:
        job=lambda w: J.to_json(B.pretrain_job(STUDY, w.size)),
    wildcard_constraints:
        size="|".join(LADDER) or "^$",
    priority: lambda w: larger_first(w.size)
    log:
        "logs/base/size~{size}.log",
    benchmark:
        "benchmarks/base/size~{size}.tsv"
    threads: res("base", "threads")
    resources:
        mem_mb=res("base", "mem_mb"),
        runtime=res("base", "runtime"),
        gpu=res("base", "gpu"),
        slurm_partition=slurm("partition"),
        slurm_account=slurm("account"),
    shell:
        "race pretrain --job {params.job:q} --threads {threads} > {log:q} 2>&1"
