"""Offline stand-ins for a real-model study, so that its whole code path runs on a CPU.

``configs/rehearsal.yaml`` is ``configs/qwen2.5.yaml`` with the hub replaced by what
:func:`write_stand_ins` writes (``make rehearsal``)::

    OUT/gsm8k/{train,test}.jsonl    GSM8K format (``question``; ``answer`` ending in ``#### N``),
                                    read through ``datasets``' ``json`` builder (task.kind hf)
    OUT/Qwen2.5-tiny/               a Hugging Face policy folder (config.json, safetensors, a
                                    byte-level BPE tokenizer saved as a Qwen2Tokenizer with a
                                    Qwen2.5-style chat template), briefly fine-tuned on the
                                    train split so that the rule reward is not always zero
    OUT/Qwen2.5-Math-PRM-tiny/      the Qwen2.5-Math-PRM checkpoint layout: a Qwen2 backbone
                                    (``model.*``), ``score.0`` / ``score.2``, and the step
                                    separator ``<extra_0>`` in its tokenizer (random init)

Every folder loads through the loaders a hub download goes through (``AutoTokenizer``,
``AutoModelForCausalLM``, :class:`race.feedback.qwen_math.QwenMathPRMModule`). The problems are
the arithmetic task's chains told as short word problems; the tokenizer is trained on their
text with Qwen2's pre-tokenizer pattern (digits split one by one). Deterministic for a seed.
"""

from __future__ import annotations

import json
import random
import tempfile
from pathlib import Path

from race.core.atomic import write_json_atomic
from race.core.specs import PretrainSpec, TaskSpec, TeacherSpec
from race.data.task import gsm8k_record, make_splits, write_jsonl
from race.data.tokenizer import load_tokenizer

#: Qwen2's pre-tokenizer split (its tokenizer.json): words, single digits, punctuation runs,
#: newlines and spaces.
QWEN_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"
                r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
#: Qwen2.5's special tokens that matter here: end of text (the base models' EOS and pad), the
#: chat turns, and the Math PRM's step separator.
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<extra_0>"]
#: Qwen2.5's chat template (without its tool-calling branches).
CHAT_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if not (message.role == 'system' and loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")
#: The policies: folder -> (ladder shape, layers). One, at the ladder's nano width and two
#: layers: a CPU without native bfloat16 emulates it (a learning step of 128 rows takes
#: seconds), and the rehearsal must fit its few minutes; more sizes add jobs, not code paths.
POLICIES = {"Qwen2.5-tiny": ("nano", 2)}
PRM = "Qwen2.5-Math-PRM-tiny"
NAMES = ["Sam", "Ana", "Lee", "Kim", "Max", "Ivy"]
THINGS = ["coins", "apples", "cards", "stamps", "shells", "marbles"]


def word_problem(record: dict, rng: random.Random) -> dict:
    """An arithmetic chain as a GSM8K example: the question in words, the answer one line per
    step (``a + b = c``) and ``#### N``."""
    name, thing = rng.choice(NAMES), rng.choice(THINGS)
    moves = [f"gets {n}" if op == "+" else f"gives {n} away" for op, n in record["ops"]]
    question = f"{name} has {record['start']} {thing}, {', then '.join(moves)}. How many now?"
    lines, value = [], record["start"]
    for op, n in record["ops"]:
        new = value + n if op == "+" else value - n
        lines.append(f"{value} {op} {n} = {new}")
        value = new
    return {"question": question, "answer": "\n".join(lines) + f"\n#### {value}"}


def write_gsm8k(out: Path, task: TaskSpec, seed: int) -> dict[str, list[dict]]:
    """``train.jsonl`` and ``test.jsonl`` in GSM8K's format (eval-in and OOD chains both in
    test: GSM8K has no OOD split)."""
    rng = random.Random(f"stand-ins-{seed}")
    splits = make_splits(task)
    data = {"train": [word_problem(p.to_record(), rng) for p in splits["train"]],
            "test": [word_problem(p.to_record(), rng) for p in splits["eval_in"]]}
    for name, rows in data.items():
        write_jsonl(out / f"{name}.jsonl", rows)
    return data


def train_tokenizer(texts: list[str], vocab_size: int):
    """A byte-level BPE trained on ``texts`` with Qwen2's pre-tokenizer, as the
    ``PreTrainedTokenizerFast`` of a Qwen2.5 base model (EOS and pad ``<|endoftext|>``)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    core.decoder = decoders.ByteLevel()
    core.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(
        tokenizer_object=core, eos_token="<|endoftext|>", pad_token="<|endoftext|>",
        additional_special_tokens=SPECIAL_TOKENS[1:], clean_up_tokenization_spaces=False,
        chat_template=CHAT_TEMPLATE)


def save_as_qwen(tokenizer, folder: Path) -> None:
    """Save ``tokenizer`` into ``folder`` as a hub Qwen2.5 folder names it
    (``tokenizer_class: Qwen2Tokenizer``), so that it reloads through ``AutoTokenizer``."""
    tokenizer.save_pretrained(folder)
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["tokenizer_class"] = "Qwen2Tokenizer"
    write_json_atomic(config_path, config, indent=2)


def write_policy(name: str, shape: tuple[str, int], sft_dir: Path, tokenizer_dir: Path,
                 out: Path, token_budget: int, seed: int) -> dict:
    """A ladder-shaped Qwen2 policy on the BPE vocabulary, fine-tuned on the train split's
    solutions (race.policy.pretrain, clean teacher), saved as a Hugging Face folder."""
    from race.policy.pretrain import pretrain

    spec = PretrainSpec(token_budget=token_budget, batch_size=32, learning_rate=3e-3,
                        seed=seed, eval_examples=40, eval_max_new_tokens=48)
    record = pretrain(shape[0], sft_dir, tokenizer_dir, out / name, spec, layers=shape[1],
                      teacher=TeacherSpec(noisy=False))
    save_as_qwen(load_tokenizer(tokenizer_dir), out / name)
    (out / name / "pre.json").unlink()  # a hub folder holds none; its accuracy is returned
    return {"shape": f"{shape[0]} x {shape[1]} layers", "params": record["params"],
            "eval_in_accuracy": record["eval_in_accuracy"]}


def write_prm(tokenizer_dir: Path, out: Path, seed: int) -> None:
    """A randomly initialised PRM in the Qwen2.5-Math-PRM layout on the BPE vocabulary."""
    import torch

    from race.feedback.qwen_math import QwenMathPRMModule
    from race.policy.ladder import ladder_config

    tokenizer = load_tokenizer(tokenizer_dir)
    config = ladder_config("nano", len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                           eos_token_id=tokenizer.eos_token_id, layers=2)
    torch.manual_seed(seed)
    QwenMathPRMModule(config).save_pretrained(out / PRM)
    save_as_qwen(tokenizer, out / PRM)


def write_stand_ins(out: str | Path, *, seed: int = 0, n_train: int = 1500, n_test: int = 100,
                    vocab_size: int = 384, token_budget: int = 300_000) -> dict:
    """Write the rehearsal's data, policies and PRM under ``out`` (module docstring); returns
    what was written, with each policy's greedy eval-in accuracy after its fine-tuning."""
    out = Path(out)
    task = TaskSpec(seed=seed, n_train=n_train, n_eval_in=n_test, n_eval_ood=1, max_steps=2,
                    max_operand=9, max_value=19)
    data = write_gsm8k(out / "gsm8k", task, seed)
    texts = [f"{r['question']}\n{r['answer']}" for r in data["train"]]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        save_as_qwen(train_tokenizer(texts, vocab_size), tmp / "tokenizer")
        # The SFT reads race's record format: the same examples through the GSM8K mapper.
        for split, rows in (("train", data["train"]), ("eval_in", data["test"])):
            write_jsonl(tmp / "sft" / f"{split}.jsonl", map(gsm8k_record, rows))
        policies = {name: write_policy(name, shape, tmp / "sft", tmp / "tokenizer", out,
                                       token_budget, seed)
                    for name, shape in POLICIES.items()}
        write_prm(tmp / "tokenizer", out, seed)
    summary = {"data": str(out / "gsm8k"), "policies": policies, "prm": str(out / PRM)}
    write_json_atomic(out / "stand_ins.json", summary, indent=2)
    return summary
