# Frontier tables, figures, report.md and summary.md (regenerate with `make figures`), and what
# `snakemake --report report.zip` shows: the report page, the main tables, each figure with its
# caption.

FIGURES = ["frontier", "compute_breakdown", "same_flop", "regime_map", "race_agreement", "fits"]
PER_TARGET = ["frontier", "regime_map", "race_agreement", "fits"]


rule report:
    conda:
        "../../envs/race.yaml"
    input:
        stages=in_results("stages.csv"),
        prms=expand(in_results("prm/size~{prm}/prm.json"), prm=PRMS),
    output:
        report=in_reports("report.md"),
        # The study's answer in sentences (the top of report.md alone: race.analysis.findings).
        summary=in_reports("summary.md"),
        # report.md as HTML with the files it shows and links (race.analysis.report_pages): a
        # folder packed whole, so that the page's relative links resolve inside the zip of
        # `snakemake --report report.zip` (a single-file report.html cannot hold a folder).
        page=report(
            directory(in_reports("report")),
            htmlindex="index.html",
            caption="../report/report.rst",
            category="Report",
        ),
        frontier=report(
            in_reports("frontier.csv"),
            caption="../report/frontier.rst",
            category="Tables",
        ),
        regime=report(in_reports("regime.csv"), caption="../report/regime.rst", category="Tables"),
        feedback=report(
            in_reports("feedback.csv"),
            caption="../report/feedback.rst",
            category="Tables",
        ),
        # One entry per figure, each with its own caption, written by the job from the
        # captions report.md uses (race.analysis.report_pages).
        **{
            f"figure_{name}": report(
                in_reports(f"figures/{name}.png"),
                caption=os.path.abspath(in_reports(f"captions/{name}.rst")),
                category="Figures",
            )
            for name in FIGURES
        },
        # The single-column versions (race.analysis.paper_figures): <reward>/<target> files
        # for the study's RACE targets, or <reward> files; which exist depends on the data.
        **{
            f"panels_{name}": report(
                directory(in_reports(f"figures/{name}")),
                caption=os.path.abspath(in_reports(f"captions/{name}.rst")),
                category="Single-column figures",
                patterns=["{reward}/{target}.png"] if name in PER_TARGET else ["{reward}.png"],
            )
            for name in FIGURES
        },
    params:
        config=STUDY.slice("study", "eval", "race", "rewards"),
        out=lambda w, output: os.path.dirname(output.report),
    log:
        "logs/report.log",
    threads: res("report", "threads")
    resources:
        mem_mb=res("report", "mem_mb"),
        runtime=res("report", "runtime"),
    shell:
        "race report {input.stages:q} --prm {input.prms:q} --out {params.out:q} --config {params.config:q} --threads {threads} > {log:q} 2>&1"
