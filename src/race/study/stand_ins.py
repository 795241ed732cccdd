"""Offline stand-ins for a real-model study, so that its whole code path runs on a CPU.

``configs/rehearsal.yaml`` is ``configs/qwen2.5.yaml`` with the hub replaced by what
:func:`write_stand_ins` writes (``make rehearsal``)::

    OUT/gsm8k/{train,test}.jsonl    GSM8K format (``question``; ``answer`` ending in ``#### N``),
                                    read through ``datasets``' ``json`` builder (task.kind hf)
    OUT/Qwen2.5-tiny/               a Hugging Face policy folder: a tiny Qwen2 on Qwen2.5's real
                                    tokenizer (race.study.qwen_vocab) and config vocabulary
                                    (151,936 rows), fine-tuned on the train split so that the
                                    rule reward is not always zero
    OUT/Qwen2.5-Math-PRM-tiny/      the Qwen2.5-Math-PRM checkpoint layout: a Qwen2 backbone
                                    (``model.*``, Qwen2.5-7B's 152,064 rows), ``score.0`` /
                                    ``score.2``, and the real vocabulary with its step separator
                                    ``<extra_0>`` at id 151651 (random init)

Every folder loads through the loaders a hub download goes through (``AutoTokenizer``,
``AutoModelForCausalLM``, :class:`race.feedback.qwen_math.QwenMathPRMModule`). The problems are
the arithmetic task's chains told as short word problems. Deterministic for a seed.

The fine-tuning is exact full-vocabulary training at the cost of a small vocabulary: every
token the task's text never uses shares one embedding row ("other"), so the full softmax's
normaliser is that of the used tokens plus ``log(n_other)`` added to the shared row's logit,
and a model over the used tokens and that one row, trained with that offset, *is* the
full-vocabulary model once the shared row is copied to every unused id. (Its logits cost a
152k-wide matmul and softmax per token otherwise: minutes on a CPU.)
"""

from __future__ import annotations

import math
import random
from pathlib import Path

from race.core.atomic import saving_weights, write_json_atomic
from race.core.specs import PretrainSpec, TaskSpec
from race.data.task import Record, gsm8k_record, make_splits, write_jsonl
from race.study.qwen_vocab import POLICY_VOCAB, PRM_VOCAB, write_qwen25_tokenizer

#: The policies: folder -> (ladder shape, layers). One, at the ladder's nano width and two
#: layers: a CPU without native bfloat16 emulates it, sampling from 151,936 logits costs a few
#: milliseconds a row and token, and the rehearsal must fit its few minutes; more sizes add
#: jobs, not code paths.
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


class SharedRowHead:
    """The compact model's LM head: the tied weight's logits, plus ``log(n_other)`` on the
    shared row (module docstring)."""

    def __init__(self, head, other: int, n_other: int):
        import torch

        class Head(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.head = head
                offset = torch.zeros(head.weight.shape[0])
                offset[other] = math.log(n_other)
                self.register_buffer("offset", offset, persistent=False)

            def forward(self, hidden):
                return self.head(hidden) + self.offset

        self.module = Head()


def finetune_compact(shape: tuple[str, int], tokenizer, train: list[Record], spec: PretrainSpec,
                     vocab: int):
    """The fine-tuned policy on ``vocab`` rows (module docstring): the supervised loop of
    race.policy.pretrain (loss on solution + EOS tokens, AdamW, warmup then cosine), on the
    used tokens and one shared row."""
    import torch
    from transformers import Qwen2ForCausalLM

    from race.policy.ladder import ladder_config
    from race.policy.optim import IGNORE_INDEX, length_groups, optimizer_step
    from race.policy.pretrain import lr_at

    eos = tokenizer.eos_token_id
    prompts = [tokenizer(r.prompt, add_special_tokens=False)["input_ids"] for r in train]
    targets = [tokenizer(r.solution, add_special_tokens=False)["input_ids"] + [eos]
               for r in train]
    used = sorted({eos, *(i for ids in prompts + targets for i in ids)})
    compact = {t: i for i, t in enumerate(used)}
    other = len(used)
    torch.manual_seed(spec.seed)
    model = Qwen2ForCausalLM(ladder_config(shape[0], other + 1, pad_token_id=compact[eos],
                                           eos_token_id=compact[eos], layers=shape[1]))
    model.lm_head = SharedRowHead(model.lm_head, other, vocab - len(used)).module
    rows = [([compact[t] for t in p + g], [IGNORE_INDEX] * len(p) + [compact[t] for t in g])
            for p, g in zip(prompts, targets, strict=True)]
    opt = torch.optim.AdamW(model.parameters(), lr=spec.learning_rate,
                            weight_decay=spec.weight_decay, betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(spec.seed)
    model.train()
    tokens = 0
    while tokens < spec.token_budget:  # epochs, each in a new order
        order = torch.randperm(len(rows), generator=gen).tolist()
        for start in range(0, len(rows) - spec.batch_size + 1, spec.batch_size):
            batch = [rows[i] for i in order[start:start + spec.batch_size]]
            optimizer_step(model, opt, lr_at(tokens, spec),
                           length_groups(batch, compact[eos], 1))
            tokens += sum(len(ids) for ids, _ in batch)
            if tokens >= spec.token_budget:
                break
    return _full_vocabulary(model.eval(), shape, used, vocab, eos)


def _full_vocabulary(model, shape: tuple[str, int], used: list[int], vocab: int, eos: int):
    """The compact model as a ``vocab``-row Qwen2 (tied embeddings): used tokens at their
    ids, the shared row at every other id."""
    import torch
    from transformers import Qwen2ForCausalLM

    from race.policy.ladder import ladder_config

    model.lm_head = model.lm_head.head
    state = model.state_dict()
    rows = state["model.embed_tokens.weight"]
    embedding = rows[len(used)].expand(vocab, -1).clone()
    embedding[torch.tensor(used)] = rows[:len(used)]
    full = Qwen2ForCausalLM(ladder_config(shape[0], vocab, pad_token_id=eos, eos_token_id=eos,
                                          layers=shape[1]))
    state["model.embed_tokens.weight"] = embedding
    state.pop("lm_head.weight", None)
    full.load_state_dict(state, strict=False)
    full.tie_weights()
    return full.eval()


def write_policy(name: str, shape: tuple[str, int], train: list[Record], test: list[Record],
                 out: Path, token_budget: int, seed: int) -> dict:
    """A ladder-shaped Qwen2 policy on Qwen2.5's tokenizer and config vocabulary, fine-tuned
    on the train split's solutions, saved as a Hugging Face folder."""
    from race.data.tokenizer import load_tokenizer
    from race.policy.ladder import count_parameters
    from race.policy.pretrain import greedy_accuracy

    folder = write_qwen25_tokenizer(out / name, "policy")
    tokenizer = load_tokenizer(folder)
    spec = PretrainSpec(token_budget=token_budget, batch_size=32, learning_rate=6e-3, seed=seed)
    model = finetune_compact(shape, tokenizer, train, spec, POLICY_VOCAB)
    with saving_weights(folder, f"stand-in policy {folder}"):
        model.save_pretrained(folder, safe_serialization=True)
    accuracy, _ = greedy_accuracy(model, tokenizer, test[:40], 48)
    return {"shape": f"{shape[0]} x {shape[1]} layers", "params": count_parameters(model)[0],
            "eval_in_accuracy": accuracy}


def write_prm(out: Path, seed: int) -> None:
    """A randomly initialised PRM in the Qwen2.5-Math-PRM layout on the real vocabulary."""
    import torch

    from race.data.tokenizer import load_tokenizer
    from race.feedback.qwen_math import QwenMathPRMModule
    from race.policy.ladder import ladder_config

    folder = write_qwen25_tokenizer(out / PRM, "prm")
    tokenizer = load_tokenizer(folder)
    config = ladder_config("nano", PRM_VOCAB, pad_token_id=tokenizer.pad_token_id,
                           eos_token_id=tokenizer.eos_token_id, layers=2)
    torch.manual_seed(seed)
    # In bfloat16, as the hub checkpoint is: a float32 job then loads a converted copy.
    QwenMathPRMModule(config).to(torch.bfloat16).save_pretrained(folder)


def write_stand_ins(out: str | Path, *, seed: int = 0, n_train: int = 1000, n_test: int = 100,
                    token_budget: int = 600_000) -> dict:
    """Write the rehearsal's data, policies and PRM under ``out`` (module docstring); returns
    what was written, with each policy's greedy eval-in accuracy after its fine-tuning."""
    out = Path(out)
    # One-step problems (a step line and the answer line: two PRM steps): the shortest
    # completions that still have steps, since every token sampled costs a softmax over 151,936.
    task = TaskSpec(seed=seed, n_train=n_train, n_eval_in=n_test, n_eval_ood=1, max_steps=1,
                    max_operand=19, max_value=39)
    data = write_gsm8k(out / "gsm8k", task, seed)
    train, test = ([Record(**gsm8k_record(r)) for r in data[split]]
                   for split in ("train", "test"))
    policies = {name: write_policy(name, shape, train, test, out, token_budget, seed)
                for name, shape in POLICIES.items()}
    write_prm(out, seed)
    summary = {"data": str(out / "gsm8k"), "policies": policies, "prm": str(out / PRM)}
    write_json_atomic(out / "stand_ins.json", summary, indent=2)
    return summary
