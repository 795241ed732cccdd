# Create the MLflow DB, experiment and study parent run once, before parallel jobs: a fresh
# sqlite DB created by several processes at once fails in its schema migration. Needed only
# when training jobs log live (mlflow.live).


rule mlflow_init:
    conda:
        "../../envs/race.yaml"
    output:
        in_results("mlflow/initialized.json"),
    params:
        config=STUDY.slice("study", "mlflow"),
    log:
        "logs/mlflow_init.log",
    threads: res("mlflow_init", "threads")
    resources:
        mem_mb=res("mlflow_init", "mem_mb"),
        runtime=res("mlflow_init", "runtime"),
    shell:
        "race mlflow-init --config {params.config:q} --out {output:q} > {log:q} 2>&1"


# Mirror every run folder (params, per-step metrics, evaluations) into MLflow in one job, once
# the tables are built. With mlflow.live the training jobs have logged their steps already and
# this adds the evaluations; without it, training and evaluation jobs never start MLflow.
rule mlflow_log:
    conda:
        "../../envs/race.yaml"
    input:
        runs=in_results("runs.csv"),
        selected=in_results("race/selected.json") if RACE_ON else [],
        report=in_reports("report.md"),
    output:
        in_results("mlflow/logged.json"),
    params:
        # The resolved config: the mirror rebuilds each cell's train and eval jobs (run
        # params, expected evaluations) and attaches the config to the study run. Less how
        # jobs are scheduled (resources, the SLURM partition) and where reports go, so that
        # editing those reruns nothing here.
        config=STUDY.slice(*(k for k in STUDY.config
                             if k not in ("resources", "slurm", "reports_dir"))),
        selected=lambda w, input: ["--selected", input.selected] if RACE_ON else [],
        reports=lambda w, input: os.path.dirname(input.report),
    log:
        "logs/mlflow_log.log",
    threads: res("mlflow_log", "threads")
    resources:
        mem_mb=res("mlflow_log", "mem_mb"),
        runtime=res("mlflow_log", "runtime"),
    shell:
        "race mlflow-log --config {params.config:q} {params.selected:q} --reports {params.reports:q} --out {output:q} > {log:q} 2>&1"
