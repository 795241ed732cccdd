# Task splits and the tokenizer.


rule data:
    output:
        train=R + "/data/train.jsonl",
        eval_in=R + "/data/eval_in.jsonl",
        eval_ood=R + "/data/eval_ood.jsonl",
    params:
        config=S.config_slice(STUDY, "task"),
    log:
        "logs/data.log",
    benchmark:
        "benchmarks/data.tsv"
    resources:
        mem_mb=res("data", "mem_mb", 1000),
        runtime=res("data", "runtime", 5),
    shell:
        "{RACE} data --config {params.config:q} --out {R}/data > {log} 2>&1"


rule tokenizer:
    output:
        R + "/tokenizer/tokenizer.json",
    log:
        "logs/tokenizer.log",
    benchmark:
        "benchmarks/tokenizer.tsv"
    resources:
        mem_mb=res("tokenizer", "mem_mb", 1000),
        runtime=res("tokenizer", "runtime", 5),
    shell:
        "{RACE} tokenizer --out {R}/tokenizer > {log} 2>&1"
