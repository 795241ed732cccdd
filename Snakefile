# RACE: where should a fixed RL post-training FLOP budget go?
# Thin entry point: config, validation, the stage files, and the final target.
from snakemake.utils import min_version

from race.study.config import check_as_written, coerce_numbers, read_yaml, validate_schema
from race.study.slurm import check_cluster

min_version("9.0")


# The default study, unless --configfile names another (which then replaces it: Snakemake
# would otherwise merge the two, mixing e.g. the default rewards into another study).
if not workflow.overwrite_configfiles:

    configfile: "config.yaml"


# Snakemake's YAML reader keeps the last of two equal keys (a second `seeds:` would silently
# replace the first); the package's reader, the one `race check-config` uses, refuses them.
for path in workflow.configfiles:
    read_yaml(path)

# The schema ships with the package (race/core/config.schema.yaml): the one place where every
# key's type, range, enum, description and default live.
# Snakemake's YAML reader reads 2e10 as a string: numbers first, as race.study.config does.
coerce_numbers(config)
check_as_written(config)  # before the schema's defaults are filled in
# Snakemake's validate() with the defaults filled in, its error led by the key it names
# (race.study.config.validate_schema); then the typed study and its cross-field checks
# (workflow/rules/common.smk).
config.update(validate_schema(config))


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/base.smk"
include: "workflow/rules/prm.smk"
include: "workflow/rules/mlflow.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/evaluate.smk"
include: "workflow/rules/aggregate.smk"
include: "workflow/rules/report.smk"


# The light jobs (data, tokenizer, tables, selection, report, MLflow) run where Snakemake runs,
# not as cluster jobs: on SLURM only the model jobs queue for a (GPU) node, and the data job
# runs where a hub is reachable. On a workstation this changes nothing.
localrules:
    all,
    tokenizer,
    data,
    aggregate_pilot,
    select,
    aggregate,
    report,
    mlflow_init,
    mlflow_log,


# On SLURM, before the first submission: a status command that can see jobs end, and a GPU
# partition for jobs that ask for a GPU (race.study.slurm); a dry run submits nothing. Locally,
# how many GPU jobs run at once, and on which devices (workflow/rules/common.smk).
onstart:
    if workflow.executor_plugin.cli_prefix == "slurm":
        for line in check_cluster(STUDY, workflow.executor_settings):
            print(f"RACE: {line}", flush=True)
    elif GPU_SLOTS is not None:
        print(f"RACE: {GPU_SLOTS.summary()}", flush=True)


rule all:
    input:
        final_targets(),
        validation_targets if RACE_ON else [],
    default_target: True
