# Task splits and the tokenizer.


rule data:
    conda:
        "../../envs/race.yaml"
    output:
        train=in_results("data/train.jsonl"),
        eval_in=in_results("data/eval_in.jsonl"),
        eval_ood=in_results("data/eval_ood.jsonl"),
    params:
        config=STUDY.data_slice(),
        out=lambda w, output: os.path.dirname(output.train),
    log:
        "logs/data.log",
    benchmark:
        "benchmarks/data.tsv"
    threads: res("data", "threads")
    resources:
        mem_mb=res("data", "mem_mb"),
        runtime=res("data", "runtime"),
    shell:
        "race data --config {params.config:q} --out {params.out:q} > {log:q} 2>&1"


rule tokenizer:
    conda:
        "../../envs/race.yaml"
    output:
        tokenizer=in_results("tokenizer/tokenizer.json"),
    params:
        out=lambda w, output: os.path.dirname(output.tokenizer),
    log:
        "logs/tokenizer.log",
    benchmark:
        "benchmarks/tokenizer.tsv"
    threads: res("tokenizer", "threads")
    resources:
        mem_mb=res("tokenizer", "mem_mb"),
        runtime=res("tokenizer", "runtime"),
    shell:
        "race tokenizer --out {params.out:q} > {log:q} 2>&1"
