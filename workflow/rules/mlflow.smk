# Create the MLflow DB, experiment and study parent run once, before parallel jobs: a fresh
# sqlite DB created by several processes at once fails in its schema migration.


rule mlflow_init:
    conda:
        "../../envs/race.yaml"
    output:
        in_results("mlflow/initialized.json"),
    params:
        race=RACE,
        spec=json.dumps(S.mlflow_spec(STUDY).__dict__, sort_keys=True),
        study=STUDY["study"],
    log:
        "logs/mlflow_init.log",
    resources:
        mem_mb=res("mlflow_init", "mem_mb", 1000),
        runtime=res("mlflow_init", "runtime", 5),
    shell:
        "{params.race} mlflow-init --spec {params.spec:q} --study {params.study} --out {output} > {log} 2>&1"
