# Frontier tables, figures and report.md (regenerate with `make figures`).


rule report:
    conda:
        "../../envs/race.yaml"
    input:
        stages=in_results("stages.csv"),
    output:
        report=report(
            "reports/report.md",
            caption="../report/report.rst",
            category="Report",
        ),
        frontier=report(
            "reports/frontier.csv",
            caption="../report/frontier.rst",
            category="Tables",
        ),
        figures=report(
            expand(
                "reports/figures/{name}.png",
                name=[
                    "frontier",
                    "compute_breakdown",
                    "same_flop",
                    "regime_map",
                    "race_agreement",
                    "fits",
                ],
            ),
            caption="../report/figures.rst",
            category="Figures",
        ),
    params:
        race=RACE,
        config=S.config_slice(STUDY, "study", "eval"),
        out=lambda w, output: os.path.dirname(output.report),
    log:
        "logs/report.log",
    threads: res("report", "threads")
    resources:
        mem_mb=res("report", "mem_mb"),
        runtime=res("report", "runtime"),
    shell:
        "{params.race} report {input.stages} --out {params.out} --config {params.config:q} > {log} 2>&1"
