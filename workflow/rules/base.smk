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
        race=RACE_MODEL,
        data=lambda w, input: os.path.dirname(input.train),
        tokenizer=lambda w, input: os.path.dirname(input.tokenizer[0]),
        out=lambda w, output: os.path.dirname(output.pre),
        config=S.config_slice(STUDY, "pretrain"),
    wildcard_constraints:
        size="|".join(LADDER) or "^$",
    log:
        "logs/base/size~{size}.log",
    benchmark:
        "benchmarks/base/size~{size}.tsv"
    threads: 1
    resources:
        mem_mb=res("base", "mem_mb", 2000),
        runtime=res("base", "runtime", 30),
    shell:
        "{params.race} pretrain --size {wildcards.size} --data {params.data} --tokenizer {params.tokenizer}"
        " --out {params.out} --config {params.config:q} > {log} 2>&1"
