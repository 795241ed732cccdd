"""Config values as researchers write them: 1e18-style FLOP counts (YAML 1.2 floats, in the
one reader and on a config Snakemake read with YAML 1.1), and a clear error naming the key for
anything in a FLOP-valued key that is not a positive number."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from race.study.config import (
    ConfigError,
    coerce_numbers,
    load_config,
    load_study,
    read_yaml,
    validate_schema,
)

ROOT = Path(__file__).resolve().parents[1]


def smoke_text(tmp_path: Path, budgets: str, pilot: str = "[4e9]", validation: str = "8e9") -> Path:
    text = (ROOT / "configs" / "smoke.yaml").read_text()
    text = re.sub(r"(?m)^budgets: .*$", f"budgets: {budgets}", text)
    text = re.sub(r"(?m)^  pilot_rungs: .*$", f"  pilot_rungs: {pilot}", text)
    text = re.sub(r"(?m)^  validation_budget: .*$", f"  validation_budget: {validation}", text)
    text = text.replace("results_dir: results", f"results_dir: {tmp_path / 'results'}")
    path = tmp_path / "study.yaml"
    path.write_text(text)
    return path


def test_scientific_notation_reads_as_numbers(tmp_path):
    config = load_config(smoke_text(tmp_path, "[4e9, 8e9, 1.6E10]"))
    assert config["budgets"] == [4e9, 8e9, 1.6e10]
    assert config["race"]["pilot_rungs"] == [4e9] and config["race"]["validation_budget"] == 8e9


def test_the_reader_reads_yaml_12_floats(tmp_path):
    path = tmp_path / "x.yaml"
    path.write_text("a: [1e18, 2E10, 1.5e9, -3e4, 1e-4, 2.0e+10, 12, '4e9', e5, 1e]\n")
    assert read_yaml(path)["a"] == [1e18, 2e10, 1.5e9, -3e4, 1e-4, 2e10, 12, "4e9", "e5", "1e"]
    assert yaml.safe_load("a: 1e18")["a"] == "1e18"  # PyYAML's own loader is left as is


def test_a_yaml_11_config_gets_the_same_numbers(tmp_path):
    """Snakemake reads --configfile with YAML 1.1 (4e9 a string); coerce_numbers, which the
    Snakefile runs before validate, fixes the numbers where the schema wants one, and leaves a
    quoted name alone."""
    path = smoke_text(tmp_path, "[4e9, 8e9, 1.6E10]")
    text = path.read_text().replace("study: race-smoke", 'study: "1e3"')
    text = re.sub(r"(?m)^  steps: 20$", "  steps: 2e1", text)
    path.write_text(text)
    snakemake = yaml.safe_load(path.read_text())
    assert snakemake["budgets"] == ["4e9", "8e9", "1.6E10"]
    config = validate_schema(coerce_numbers(snakemake))
    assert config["budgets"] == [4e9, 8e9, 1.6e10] and config["race"]["pilot_rungs"] == [4e9]
    assert config["study"] == "1e3" and config["prm"]["steps"] == 20
    assert isinstance(config["prm"]["steps"], int)
    assert config == validate_schema(coerce_numbers(read_yaml(path)))


@pytest.mark.parametrize("budgets, pilot, validation, message", [
    ("[4e9, lots, 1.6e10]", "[4e9]", "8e9", "budgets[1]: 'lots' is not a positive number of FLOPs"),
    ("[4e9, -8e9, 1.6e10]", "[4e9]", "8e9", "budgets[1]: -8e+09 is not a positive number of FLOPs"),
    ("[4e9, 8e9, 1.6e10]", "[4e9, 0]", "8e9", "race.pilot_rungs[1]: 0 is not a positive number"),
    ("[4e9, 8e9, 1.6e10]", "[4e9]", "abc", "race.validation_budget: 'abc' is not a positive"),
])
def test_a_bad_flop_value_names_its_key(tmp_path, budgets, pilot, validation, message):
    with pytest.raises(ConfigError) as err:
        load_config(smoke_text(tmp_path, budgets, pilot, validation))
    assert message in str(err.value)


def _smoke_with(tmp_path: Path, edit) -> Path:
    config = yaml.safe_load((ROOT / "configs" / "smoke.yaml").read_text())
    config["results_dir"] = str(tmp_path / "results")
    edit(config)
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _reward(entry: dict):
    return lambda c: c["rewards"].update(extra=entry)


def _task(**keys):
    return lambda c: (c.setdefault("task", {}).update(keys),
                      c.setdefault("teacher", {}).update(noisy=keys.get("kind") is None))


def _prm_bon_without_a_prm(config: dict) -> None:
    config["prm"]["sizes"] = []
    config["eval"]["prm"] = None
    del config["rewards"]["rule+prm"]
    config["race"]["targets"] = ["prm_bon"]


@pytest.mark.parametrize("edit, message", [
    (_task(min_steps=4, max_steps=2), "task.min_steps must be <= task.max_steps"),
    (_task(ood_min_steps=6, ood_max_steps=4), "task.ood_max_steps must be >= task.ood_min"),
    (_task(max_steps=4, ood_min_steps=4), "task.ood_min_steps must exceed task.max_steps"),
    (_task(max_operand=20, max_value=10), "task.max_operand must be <= task.max_value"),
    (_task(kind="hf"), "task.hf_id: required when task.kind is hf"),
    (_task(kind="hf", hf_id="openai/gsm8k"), "task.hf_ood_id: required when "
                                            "eval.targets includes ood_pass1"),
    (_task(max_operand=14, max_value=20), "task.max_value must be >= 2 * task.max_operand - 1"),
    (_task(kind="jsonl"), "task.train_jsonl: required when task.kind is jsonl"),
    (_reward({"type": "rule", "wieght": 0.3}), "'wieght' was unexpected"),
    (_reward({"type": "rule", "prm": "nano"}), "rewards.extra.prm: type rule reads no prm key"),
    (_reward({"type": "orm", "prm": "nano", "orm": "org/orm"}), "extra.prm: type orm reads"),
    (_reward({"type": "prm", "prm": "nano", "orm": "org/orm"}), "extra.orm: type prm reads"),
    (_reward({"type": "prm", "prm": "nano", "weight": 0.3}), "extra.weight: type prm reads no"),
    (_reward({"type": "orm", "orm": "org/orm", "aggregate": "mean"}), "extra.aggregate: type orm"),
    (_reward({"type": "rule", "dtype": "bfloat16"}), "rewards.extra.dtype: type rule reads no "
                                                     "dtype key (it reads verifier)"),
    (_reward({"type": "orm"}), "rewards.extra.orm: the orm reward needs a model"),
    (_reward({"type": "orm", "orm": "models/orm/v1"}), "rewards.extra.orm: 'models/orm/v1' is "
                                                       "not an existing folder or a hub id"),
    (_reward({"type": "orm", "orm": "./orm"}), "rewards.extra.orm: './orm' is not an existing"),
    (_reward({"type": "prm", "prm": "giant"}), "rewards.extra.prm: 'giant' is not one of "
                                               "prm.sizes ['nano'], an existing folder"),
    (_reward({"type": "prm", "prm": "nano", "dtype": "float8"}), "'float8' is not one of"),
    (_reward({"type": "prm", "prm": "nano", "device": "gpu"}), "'gpu' does not match"),
    (lambda c: c["training"].update(lora_targets=[]),
     "training.lora_targets: [] should be non-empty"),
    (lambda c: c["training"].update(lora_targets=["q_proj", "q_proj"]),
     "training.lora_targets: ['q_proj', 'q_proj'] has non-unique elements"),
    (lambda c: c["training"].update(lora_targets=["qproj"]), "training.lora_targets[0]: 'qproj' is "
                                                             "not one of ['q_proj'"),
    (lambda c: c["allocations"]["base"].update(num_generations=1),
     "allocations.base.num_generations: 1 is less than the minimum of 2"),
    (lambda c: c["eval"].update(targets=["pass1"]), "eval.targets[0]: 'pass1' is not one of"),
    (lambda c: c["eval"].update(targets=["maj_k", "maj_k"]), "eval.targets: ['maj_k', 'maj_k'] "
                                                             "has non-unique elements"),
    (lambda c: c["race"].update(targets=["pass1"]), "race.targets[0]: 'pass1' is not one of"),
    (lambda c: c["race"].update(targets=["maj_k"]) or c["eval"].update(search_at="base_and_top"),
     "race.targets[0]: maj_k runs only at the top rung"),
    (lambda c: c["race"].update(baseline="nope"), "race.baseline: 'nope' is not an allocation"),
    (lambda c: c["race"].update(pilot_rungs=[5.0e+9]), "race.pilot_rungs[0]: 5e+09 is not one of"),
    (lambda c: c.update(budgets=[8.0e+9, 4.0e+9]), "budgets[1]: rungs must be strictly increasing"),
    (lambda c: c.update(seeds=[0, 0]), "seeds[1]: duplicate entry 0"),
    (lambda c: c["teacher"].update(truncate=1.5), "teacher.truncate: 1.5 is greater than the "
                                                  "maximum of 1"),
    (lambda c: c["teacher"].update(operand_slip=0.5, sign_slip=0.3, arithmetic_slip=0.3),
     "teacher: operand_slip + sign_slip + arithmetic_slip must be <= 1"),
    (lambda c: c["prm"].update(init="warm"), "prm.init: 'warm' is not one of"),
    (lambda c: c["eval"].update(prm="micro"), "eval.prm: 'micro' is not one of prm.sizes"),
    (lambda c: c["sizes"].append("giant"), "sizes[2]: unknown size 'giant'"),
    (lambda c: c["allocations"].update({"a b": {}}), "allocations.a b: names may use"),
    (lambda c: c.update(study=".."), "study: the name '..' is only dots"),
    (lambda c: c["rewards"].update({"...": {"type": "rule"}}), "rewards: the name '...' is only"),
    (lambda c: c["allocations"].update({".": {}}), "allocations: the name '.' is only dots, "
                                                   "which a path reads as this or the parent"),
    (lambda c: c["eval"].update(targets=["maj_k", "prm_bon"], search_at="base_and_top")
     or c["race"].pop("targets", None), "race.targets: the pilot has no target to rank"),
    (_prm_bon_without_a_prm, "race.targets[0]: prm_bon needs a PRM"),
    (lambda c: c["eval"].update(train_temperature=0.3), "eval.train_temperature: not a setting"),
])
def test_bad_entries_name_their_key(tmp_path, edit, message):
    """Each rule, written once (a key's type, range and enum in the schema, a rule between
    keys in race.study.config), refuses its malformed config through the one reader
    (load_study), naming the key, before anything is written."""
    with pytest.raises(ConfigError) as error:
        load_study(_smoke_with(tmp_path, edit))
    assert message in str(error.value)
    assert not (tmp_path / "results").exists()


def test_reward_entries_take_the_feedback_model_options(tmp_path):
    """The keys a feedback reward passes to its model (race.core.specs.MODEL_OPTIONS)
    are schema keys, so a typo among them is an error rather than a silent default."""
    from race.core.schema import properties
    from race.core.specs import MODEL_OPTIONS

    assert set(MODEL_OPTIONS) <= set(properties("rewards"))
    options = {"batch_size": 8, "attn_implementation": "eager", "device": "cpu",
               "dtype": "bfloat16", "chat_template": False}
    config = load_config(_smoke_with(tmp_path, _reward({"type": "prm", "prm": "nano",
                                                         **options})))
    assert {k: config["rewards"]["extra"][k] for k in options} == options


def test_the_pilot_ranks_only_targets_the_pilot_rungs_measure(tmp_path):
    """Without race.targets the pilot ranks every evaluated target that has a value at its
    rungs: not a search target run only at the top rung, not prm_bon without a PRM."""
    from race.study.config import typed_study

    def edit(config):
        config["race"].pop("targets")
        config["eval"]["search_at"] = "base_and_top"

    config = load_config(_smoke_with(tmp_path, edit))
    assert typed_study(config).race_targets == (
        "in_pass1", "sampled_pass1", "ood_pass1", "native_reward")
    config["eval"]["search_at"] = "every_rung"
    assert "prm_bon" in typed_study(config).race_targets
    config["eval"]["prm"], config["prm"]["sizes"] = None, []
    targets = typed_study(config).race_targets
    assert "prm_bon" not in targets and "maj_k" in targets


def test_a_size_path_the_workflow_cannot_name_is_refused(tmp_path):
    """A space in a local model path would fail in the DAG (the size wildcard refuses it)
    with an error naming no key; the check names it."""
    folder = tmp_path / "my model"
    folder.mkdir()
    path = _smoke_with(tmp_path, lambda c: c["sizes"].append(str(folder)))
    with pytest.raises(ConfigError, match=r"sizes\[2\]: .* names a path the workflow cannot"):
        load_config(path)


@pytest.mark.parametrize("verb, out", [("data", "data"), ("aggregate", "runs.csv")])
def test_a_bad_config_is_a_message_not_a_traceback(tmp_path, capsys, verb, out):
    from race.cli import main

    path = _smoke_with(tmp_path, lambda c: c.setdefault("task", {}).update(min_steps=9))
    assert main([verb, "--config", str(path), "--out", str(tmp_path / out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"race {verb}: task.min_steps must be") and "Traceback" not in err
    assert not (tmp_path / "results").exists() and not (tmp_path / out).exists()


@pytest.mark.parametrize("text, message", [
    ("sizes: [nano\n", r"not valid YAML \(line 2, column 1\): expected"),
    ("seeds: [0]\nseeds: [1]\n", r"duplicate key 'seeds' \(line 2\)"),
])
@pytest.mark.parametrize("verb", ["check-config", "train"])
def test_a_file_that_is_not_a_config_is_named(tmp_path, capsys, text, message, verb):
    """A YAML syntax error or a repeated key names the file and the line, for every verb that
    reads a config (the model verbs through --config --cell), and exits 2."""
    from race.cli import main

    path = tmp_path / "study.yaml"
    path.write_text(text)
    argv = [verb, str(path)] if verb == "check-config" else [
        verb, "--config", str(path), "--cell", "size~nano/reward~rule/alloc~g8/seed~0"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert re.search(rf"^(race {verb}: )?{re.escape(str(path))}: {message}", err), err
    assert err.count(str(path)) == 1 and "Traceback" not in err


@pytest.mark.parametrize("job, message", [
    ("{not json", ""), ('{"unknown_field": 1}', ""), ("[1]", ""),
    # A rung of NaN or infinity: one line naming it (was an OverflowError traceback).
    ('{"rungs": [1e9, Infinity]}', "rungs[1]: inf is not a finite number"),
    ('{"rungs": [NaN]}', "rungs[0]: nan is not a finite number"),
    ('{"alloc": {"learning_rate": 1e400}}', "alloc.learning_rate: inf is not a finite number"),
])
def test_a_bad_job_is_a_message_not_a_traceback(capsys, job, message):
    from race.cli import main

    assert main(["train", "--job", job]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"race train: --job: {message}") and err.count("\n") == 1, err


@pytest.mark.parametrize("name", ["config.yaml", "configs/smoke.yaml", "configs/qwen2.5.yaml"])
def test_a_resolved_config_checks_again(tmp_path, name):
    """The resolved config (every schema default filled in: what the study logs to MLflow
    and the benches write for Snakemake) is a valid config with the same content."""
    config = load_config(ROOT / name)
    path = tmp_path / "resolved.yaml"
    path.write_text(yaml.safe_dump(config))
    assert load_config(path) == config


def test_the_first_rung_check_reserves_what_the_trainer_reserves(tmp_path):
    """The config check's bound on a cell's first step (race check-config, before any compute)
    is the trainer's own: the policy's worst-case step plus a ladder PRM's reward bound, which
    the trainer takes from the loaded feedback model."""
    from race.core.specs import PRMSpec
    from race.data.tokenizer import load_tokenizer, save_tokenizer
    from race.feedback.prm_training import init_classifier
    from race.feedback.rewards import build_reward
    from race.flops import analytic as F
    from race.flops.meter import StepMeter, generation_step_bound
    from race.policy.ladder import ladder_config
    from race.study.config import first_step_bound

    study = load_study(ROOT / "configs" / "smoke.yaml")
    tok = load_tokenizer(save_tokenizer(tmp_path / "tok"))
    prm = tmp_path / "prm" / "size~nano"
    init_classifier("nano", tok, [], PRMSpec(init="random"))[0].save_pretrained(prm)
    tok.save_pretrained(prm)
    reward = build_reward(study.rewards["rule+prm"].to_dict(), tokenizer=tok,
                          results_dir=tmp_path)
    prompt = study.max_prompt_tokens()
    arch = F.Arch.from_config(ladder_config("nano", len(tok)))
    for name, alloc in study.allocations.items():
        meter = StepMeter(arch, alloc.lora, beta=alloc.beta, num_iterations=alloc.num_iterations)
        trainer = generation_step_bound(meter, alloc.rows, prompt,
                                        alloc.max_completion_length, reward.reads)
        assert first_step_bound(study, "nano", name, "rule+prm", prompt) == trainer
        assert first_step_bound(study, "nano", name, "rule", prompt) < trainer


def test_each_budget_has_a_rung_folder_of_its_own(tmp_path):
    # budget~<7 significant digits>: two budgets in one folder would overwrite each other.
    path = smoke_text(tmp_path, "[4.0000001e9, 4.0000002e9, 8e9]", pilot="[4.0000001e9]")
    with pytest.raises(ConfigError, match=r"budgets\[0\]: 4000000100.0 would be written to "
                                          r"budget~4e9"):
        load_study(path)


def test_a_results_dir_holding_another_study_is_refused(tmp_path):
    from race.core.study import STUDY_MARKER
    from race.study.config import typed_study

    study = load_study(smoke_text(tmp_path, "[4e9, 8e9]"))
    study.claim_results_dir(check_only=True)
    assert not study.results.exists()  # a dry run writes nothing
    study.claim_results_dir()
    marker = study.results / STUDY_MARKER
    assert marker.read_text() == "race-smoke\n"
    study.claim_results_dir()  # its own study: fine
    with pytest.raises(ConfigError, match=f"results_dir: {study.results_dir} holds the "
                                          "study 'race-smoke'"):
        typed_study({**study.config, "study": "another"}).claim_results_dir()


#: Numeric keys a researcher sets, by where they sit in the config (issue 55's list).
NUMERIC_KEYS = [("training", "learning_rate"), ("training", "beta"), ("training", "temperature"),
                ("training", "max_grad_norm"), ("teacher", "truncate"),
                ("pretrain", "learning_rate"), ("eval", "temperature"), (None, "gpu_memory_gb"),
                ("rewards.rule+prm", "weight"), ("allocations.base", "lora_alpha")]


def _set_key(config: dict, section: str | None, key: str, value) -> None:
    holder = config
    for part in (section.split(".", 1) if section else []):
        holder = holder.setdefault(part, {})
    holder[key] = value


@pytest.mark.parametrize("value, text", [(float("nan"), "nan"), (float("inf"), "inf"),
                                         (float("-inf"), "-inf")])
@pytest.mark.parametrize("section, key", NUMERIC_KEYS)
def test_a_number_that_is_not_finite_is_refused_naming_its_key(tmp_path, section, key, value,
                                                                 text):
    """NaN and infinity pass no number key: each is refused in one line naming the key, before
    anything is written (a NaN learning rate used to reach the train jobs)."""
    path = _smoke_with(tmp_path, lambda c: _set_key(c, section, key, value))
    with pytest.raises(ConfigError) as error:
        load_study(path)
    where = f"{section}.{key}" if section else key
    assert str(error.value) == f"{where}: {text} is not a finite number"
    assert not (tmp_path / "results").exists()


@pytest.mark.parametrize("edit, message", [
    (lambda c: c.update(study="race-smoke\n"), "study: 'race-smoke\\n' holds a control"),
    (lambda c: c.update(study=" race-smoke"), "study: ' race-smoke' starts or ends with"),
    (lambda c: c["rewards"].update({"rule ": {"type": "rule"}}),
     "rewards.rule  (the name): 'rule ' starts or ends with whitespace"),
    (lambda c: c["allocations"].update({"a\tb": {}}), "holds a control character"),
    (lambda c: c["sizes"].append("nano\n"), "sizes[2]: 'nano\\n' holds a control character"),
    (lambda c: c.setdefault("task", {}).update(hf_id="openai/gsm8k\x00"),
     "task.hf_id: 'openai/gsm8k\\x00'"),
])
def test_names_and_text_with_stray_characters_are_refused(tmp_path, edit, message):
    with pytest.raises(ConfigError) as error:
        load_study(_smoke_with(tmp_path, edit))
    assert message in str(error.value)
    assert not (tmp_path / "results").exists()


#: Values of the right type that no researcher means, by key: each is refused naming its key.
OUT_OF_RANGE = [
    ("allocations.base", "num_generations", 1e9), ("allocations.base", "prompts_per_step", 0),
    ("allocations.base", "lora_rank", 1e30), ("task", "n_train", 1e30), ("task", "seed", -1),
    ("task", "seed", 1e30), ("pretrain", "token_budget", 1e30), ("pretrain", "seed", 1e30),
    ("prm", "steps", 1e30), ("prm", "n_prompts", 0), ("training", "learning_rate", 0),
    ("training", "learning_rate", 1e30), ("training", "beta", -1),
    ("training", "temperature", 0), ("training", "temperature", 1e30),
    ("training", "max_completion_length", 1e30), ("eval", "sampled_k", 0),
    ("eval", "sampled_prompts", 1e30), ("eval", "seed", 1e30),
    ("resources.train", "threads", 1e30),
]


@pytest.mark.parametrize("section, key, value", OUT_OF_RANGE)
def test_a_number_out_of_range_is_refused_naming_its_key(tmp_path, section, key, value):
    path = _smoke_with(tmp_path, lambda c: _set_key(c, section, key, value))
    with pytest.raises(ConfigError) as error:
        load_study(path)
    assert str(error.value).startswith(f"{section}.{key}: "), str(error.value)
    assert "minimum" in str(error.value) or "maximum" in str(error.value), str(error.value)
    assert not (tmp_path / "results").exists()


def test_check_config_answers_a_huge_count_without_allocating_for_it(tmp_path):
    """num_generations: 1e9 once made `race check-config` allocate ~23 GB (every row of the
    worst-case batch): now the schema refuses it, in one line, in a small process (its own
    peak resident memory, VmHWM, printed as it exits: getrusage's maximum would include the
    forking test process's, which Linux carries across exec)."""
    path = _smoke_with(tmp_path, lambda c: c["allocations"]["base"].update(
        num_generations=1e9))
    measured = ("import re, runpy, sys\n"
                "sys.argv = ['race', 'check-config', sys.argv[1]]\n"
                "try:\n    runpy.run_module('race.cli', run_name='__main__')\n"
                "finally:\n    status = open('/proc/self/status').read()\n"
                "    print('peak_kib', re.search(r'VmHWM:\\s+(\\d+) kB', status).group(1), "
                "file=sys.stderr)\n")
    proc = subprocess.run([sys.executable, "-c", measured, str(path)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode != 0
    assert "allocations.base.num_generations: " in proc.stderr, proc.stderr[-2000:]
    peak_kib = int(re.search(r"peak_kib (\d+)", proc.stderr).group(1))
    assert peak_kib < 1024 ** 2, f"{peak_kib / 1024:.0f} MiB"
