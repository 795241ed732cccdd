# Task splits and the tokenizer.


rule data:
    conda:
        "../../envs/race.yaml"
    output:
        train=in_results("data/train.jsonl"),
        eval_in=in_results("data/eval_in.jsonl"),
        eval_ood=in_results("data/eval_ood.jsonl"),
    params:
        race=RACE,
        config=S.config_slice(STUDY, "task"),
        out=lambda w, output: os.path.dirname(output.train),
    log:
        "logs/data.log",
    benchmark:
        "benchmarks/data.tsv"
    resources:
        mem_mb=res("data", "mem_mb", 1000),
        runtime=res("data", "runtime", 5),
    shell:
        "{params.race} data --config {params.config:q} --out {params.out} > {log} 2>&1"


rule tokenizer:
    conda:
        "../../envs/race.yaml"
    output:
        tokenizer=in_results("tokenizer/tokenizer.json"),
    params:
        race=RACE,
        out=lambda w, output: os.path.dirname(output.tokenizer),
    log:
        "logs/tokenizer.log",
    benchmark:
        "benchmarks/tokenizer.tsv"
    resources:
        mem_mb=res("tokenizer", "mem_mb", 1000),
        runtime=res("tokenizer", "runtime", 5),
    shell:
        "{params.race} tokenizer --out {params.out} > {log} 2>&1"
