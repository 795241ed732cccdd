"""Inputs checked before compute: task files and local model / adapter folders, each error
naming the config key and the file (and line)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from race.study.config import ConfigError, load_config, load_study
from race.study.inputs import (
    InputError,
    check_adapter_dir,
    check_devices_here,
    check_model_dir,
    check_rung_snapshots,
)

ROOT = Path(__file__).resolve().parents[1]


def smoke(tmp_path: Path, **override) -> Path:
    raw = yaml.safe_load((ROOT / "configs" / "smoke.yaml").read_text())
    raw["results_dir"] = str(tmp_path / "results")
    raw.update(override)
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def jsonl_task(tmp_path: Path, train: str | bytes) -> dict:
    good = tmp_path / "eval.jsonl"
    good.write_text(json.dumps({"prompt": "1+1=", "answer": "2"}) + "\n")
    train_path = tmp_path / "train.jsonl"
    train_path.write_bytes(train if isinstance(train, bytes) else train.encode())
    return {"kind": "jsonl", "train_jsonl": str(tmp_path / "train.jsonl"),
            "eval_in_jsonl": str(good), "eval_ood_jsonl": str(good)}


@pytest.mark.parametrize("train, message", [
    ("", "task.train_jsonl: {path}: no records"),
    ("\n  \n", "task.train_jsonl: {path}: no records"),
    ('{"prompt": "1+1=", "answer": "2"}\n[1, 2]\n', "{path}:2: a record is a JSON object"),
    ('{"prompt": "1+1="}\n', "{path}:1: record lacks key(s) ['answer']"),
    ('{"prompt": "1+1=", "answer": "2"}\n{"prompt": \n', "{path}:2: not valid JSON"),
    # Text fields hold non-empty text: a null is not the prompt "None".
    ('{"prompt": null, "answer": null}\n', "{path}:1: prompt must be non-empty text, not a "
                                            "null"),
    ('{"prompt": "1+1=", "answer": null}\n', "{path}:1: answer must be non-empty text, not a "
                                              "null"),
    ('{"prompt": "", "answer": "2"}\n', "{path}:1: prompt must be non-empty text, not empty"),
    ('{"prompt": " \\n", "answer": "2"}\n', "{path}:1: prompt must be non-empty text, not "
                                             "empty"),
    ('{"prompt": {"text": "1+1="}, "answer": "2"}\n', "{path}:1: prompt must be non-empty "
                                                     "text, not a dict"),
    ('{"prompt": "1+1=", "answer": 2}\n', "{path}:1: answer must be non-empty text, not an int"),
    ('{"prompt": "1+1=", "answer": "2", "solution": [1]}\n', "{path}:1: solution must be "
                                                             "text, not a list"),
    (b'{"prompt": "1+1=", "answer": "2"}\n{"prompt": "1\xff", "answer": "2"}\n',
     "{path}:2: not UTF-8 (byte 14 of the line)"),
])
def test_bad_task_files_are_named_with_their_line(tmp_path, train, message):
    path = smoke(tmp_path, task=jsonl_task(tmp_path, train), teacher={"noisy": False})
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert message.format(path=tmp_path / "train.jsonl") in str(err.value)
    assert not (tmp_path / "results").exists()  # refused before anything is written


def test_a_folder_that_is_not_a_model_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"sizes\[1\]: /etc is not a model folder"):
        load_config(smoke(tmp_path, sizes=["nano", "/etc"]))


def test_model_folders_need_safetensors_and_a_tokenizer(tmp_path, tokenizer):
    from race.policy.ladder import build_ladder_model

    model = tmp_path / "model"
    build_ladder_model("nano", tokenizer, seed=0).save_pretrained(model)
    with pytest.raises(InputError, match="has no tokenizer"):
        check_model_dir(model, "sizes[0]")
    tokenizer.save_pretrained(model)
    check_model_dir(model, "sizes[0]")  # a complete folder passes
    (model / "model.safetensors").rename(model / "pytorch_model.bin")
    with pytest.raises(InputError, match=r"sizes\[0\]: .* holds pickle weights "
                                         r"\(pytorch_model.bin\); RACE loads safetensors only"):
        check_model_dir(model, "sizes[0]")


def test_pickled_adapters_are_refused(tmp_path):
    adapter = tmp_path / "budget~1e9"
    adapter.mkdir()
    with pytest.raises(InputError, match="no LoRA adapter"):
        check_adapter_dir(adapter)
    (adapter / "adapter_config.json").write_text(json.dumps({"r": 4}))
    (adapter / "adapter_model.bin").write_bytes(b"not unpickled")
    with pytest.raises(InputError, match=r"pickle weights \(adapter_model.bin\)"):
        check_adapter_dir(adapter)


def _rung(run: Path, budget: str, weights: str, done: bool = True) -> Path:
    folder = run / f"budget~{budget}"
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text(json.dumps({"r": 4}))
    (folder / weights).write_bytes(b"never loaded")
    if done:
        (folder / "DONE").write_text("")
    return folder


def test_a_finished_rung_with_a_pickle_adapter_is_refused_before_any_job(tmp_path):
    """What the workflow checks as it starts: a finished rung (DONE) whose adapter evaluation
    cannot load is named, with both fixes, before Snakemake schedules (and so deletes the
    outputs of) the cell's evaluate job; a rung still being written is its training job's."""
    study = load_study(smoke(tmp_path))
    run = study.run_dir(study.grid_cells()[0])
    good = _rung(run, "4e9", "adapter_model.safetensors")
    (good / "eval.json").write_text("{}")
    bad = _rung(run, "8e9", "adapter_model.bin")
    _rung(run, "1.6e10", "adapter_model.bin", done=False)
    with pytest.raises(InputError) as error:
        check_rung_snapshots(study)
    assert str(error.value) == (
        f"rung snapshot: {bad} holds pickle weights (adapter_model.bin); RACE loads "
        "safetensors only (resave with save_pretrained(..., safe_serialization=True)); delete "
        "that folder and rerun to have the cell's training job write it again")
    assert (good / "eval.json").read_text() == "{}"
    (bad / "adapter_model.bin").rename(bad / "adapter_model.safetensors")
    check_rung_snapshots(study)


def test_a_device_this_machine_lacks_is_refused_before_any_job(tmp_path):
    """What the workflow checks as it starts on the local executor: every device a model job
    asks for exists here (torch is imported only for a cuda device)."""
    import torch

    raw = yaml.safe_load((ROOT / "configs" / "smoke.yaml").read_text())
    for device in ("auto", "cpu"):
        check_devices_here(load_study(smoke(tmp_path, device=device)))
    seen = torch.cuda.device_count()
    rewards = {name: {**entry, "device": f"cuda:{seen}"} if "prm" in entry else entry
               for name, entry in raw["rewards"].items()}
    with pytest.raises(ConfigError, match=rf"rewards\.\S+\.device: cuda:{seen}, but torch "
                                          rf"sees {seen} CUDA device\(s\) on this machine"):
        check_devices_here(load_study(smoke(tmp_path, rewards=rewards)))
    if not seen:
        with pytest.raises(ConfigError, match="device: cuda, but torch sees no CUDA device"):
            check_devices_here(load_study(smoke(tmp_path, device="cuda")))


def test_check_config_reports_the_bad_input(tmp_path):
    path = smoke(tmp_path, task=jsonl_task(tmp_path, ""), teacher={"noisy": False})
    proc = subprocess.run([sys.executable, "-m", "race.cli", "check-config", str(path)],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert f"task.train_jsonl: {tmp_path / 'train.jsonl'}: no records" in proc.stderr


def test_a_jsonl_task_must_give_the_ladder_solutions_and_prms_steps(tmp_path):
    """The ladder's base policies are fine-tuned on the training records' solutions, and a
    ladder PRM learns step labels of the arithmetic task: a jsonl task without solutions, or
    with a ladder PRM, fails at check time instead of in the pretrain or prm job."""
    task = jsonl_task(tmp_path, json.dumps({"prompt": "1+1=", "answer": "2"}) + "\n")
    with pytest.raises(ConfigError, match=r"task.train_jsonl: .* 1 record\(s\) without a "
                                          r"solution \(first: record 1\)"):
        load_config(smoke(tmp_path, task=task, teacher={"noisy": False}))
    (tmp_path / "train.jsonl").write_text(json.dumps(
        {"prompt": "1+1=", "answer": "2", "solution": "1+1=2\n#### 2"}) + "\n")
    with pytest.raises(ConfigError, match=r"prm.sizes\[0\]: a ladder PRM learns automatic "
                                          r"step labels of the arithmetic task"):
        load_config(smoke(tmp_path, task=task, teacher={"noisy": False}))


def test_a_ladder_prm_needs_what_it_is_built_from(tmp_path):
    raw = yaml.safe_load((ROOT / "configs" / "smoke.yaml").read_text())
    with pytest.raises(ConfigError, match=r"prm.init: base starts PRM 'mini' from the base "
                                          r"policy of its size"):
        load_config(smoke(tmp_path, prm={**raw["prm"], "sizes": ["mini"], "init": "base"},
                          rewards={"rule": {"type": "rule"}}, eval={**raw["eval"], "prm": None}))
    with pytest.raises(ConfigError, match=r"prm.sizes\[0\]: a ladder PRM is trained on "
                                          r"completions of the ladder's base policies"):
        load_config(smoke(tmp_path, sizes=["org/policy"]))  # a hub id: not pretrained here


def fake_model(folder: Path, architecture: str) -> Path:
    """A folder with what the input check reads: config.json, weights and a tokenizer."""
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "qwen2",
                                                    "architectures": [architecture]}))
    (folder / "model.safetensors").write_bytes(b"")
    (folder / "tokenizer.json").write_text("{}")
    return folder


def test_a_local_feedback_model_must_be_the_kind_its_key_asks_for(tmp_path):
    orm = str(fake_model(tmp_path / "orm", "Qwen2ForSequenceClassification"))
    prm = str(fake_model(tmp_path / "prm", "Qwen2ForTokenClassification"))
    rule = {"type": "rule"}
    with pytest.raises(ConfigError, match=r"rewards.x.prm: .*orm holds an ORM \(orm\), and "
                                          r"this key needs a PRM"):
        load_config(smoke(tmp_path, rewards={"rule": rule, "x": {"type": "prm", "prm": orm}}))
    with pytest.raises(ConfigError, match=r"rewards.x.orm: .*prm holds a PRM \(token\), and "
                                          r"this key needs an ORM"):
        load_config(smoke(tmp_path, rewards={"rule": rule, "x": {"type": "orm", "orm": prm}}))
    config = load_config(smoke(tmp_path, rewards={"rule": rule, "x": {"type": "orm", "orm": orm},
                                                  "y": {"type": "prm", "prm": prm}}))
    assert set(config["rewards"]) == {"rule", "x", "y"}
