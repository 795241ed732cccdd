# Feedback models: one process reward model per PRM size, trained on automatic step labels
# over completions sampled from the base policies.


rule prm:
    conda:
        "../../envs/race.yaml"
    input:
        train=rules.data.output.train,
        policies=expand(in_results("base/size~{size}/pre.json"), size=LADDER),
    output:
        prm=in_results("prm/size~{prm}/prm.json"),
    params:
        race=RACE_MODEL,
        data=lambda w, input: os.path.dirname(input.train),
        out=lambda w, output: os.path.dirname(output.prm),
        config=S.config_slice(STUDY, "prm"),
        policies=lambda w, input: ",".join(os.path.dirname(p) for p in input.policies),
    wildcard_constraints:
        prm="|".join(PRMS) or "^$",
    log:
        "logs/prm/size~{prm}.log",
    benchmark:
        "benchmarks/prm/size~{prm}.tsv"
    threads: 1
    resources:
        mem_mb=res("prm", "mem_mb", 2000),
        runtime=res("prm", "runtime", 30),
    shell:
        "{params.race} prm --size {wildcards.prm} --policies {params.policies} --data {params.data}"
        " --out {params.out} --config {params.config:q} > {log} 2>&1"
