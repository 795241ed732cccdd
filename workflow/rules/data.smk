# Task splits and the tokenizer.


rule data:
    conda:
        "../../envs/race.yaml"
    output:
        train=RD + "data/train.jsonl",
        eval_in=RD + "data/eval_in.jsonl",
        eval_ood=RD + "data/eval_ood.jsonl",
    params:
        race=RACE,
        results=R,
        config=S.config_slice(STUDY, "task"),
    log:
        "logs/data.log",
    benchmark:
        "benchmarks/data.tsv"
    resources:
        mem_mb=res("data", "mem_mb", 1000),
        runtime=res("data", "runtime", 5),
    shell:
        "{params.race} data --config {params.config:q} --out {params.results}/data > {log} 2>&1"


rule tokenizer:
    conda:
        "../../envs/race.yaml"
    output:
        RD + "tokenizer/tokenizer.json",
    params:
        race=RACE,
        results=R,
    log:
        "logs/tokenizer.log",
    benchmark:
        "benchmarks/tokenizer.tsv"
    resources:
        mem_mb=res("tokenizer", "mem_mb", 1000),
        runtime=res("tokenizer", "runtime", 5),
    shell:
        "{params.race} tokenizer --out {params.results}/tokenizer > {log} 2>&1"
