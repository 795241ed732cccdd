# Feedback models: one process reward model per PRM size, trained on automatic step labels
# over completions sampled from the base policies.


rule prm:
    conda:
        "../../envs/race.yaml"
    input:
        train=rules.data.output.train,
        policies=expand(RD + "base/size~{size}/pre.json", size=LADDER),
    output:
        RD + "prm/size~{prm}/prm.json",
    params:
        race=RACE,
        results=R,
        config=S.config_slice(STUDY, "prm"),
        policies=",".join(RD + f"base/size~{s}" for s in LADDER),
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
        "{params.race} prm --size {wildcards.prm} --policies {params.policies} --data {params.results}/data"
        " --out {params.results}/prm/size~{wildcards.prm} --config {params.config:q} > {log} 2>&1"
