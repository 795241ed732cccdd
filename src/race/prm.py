"""Learned feedback models: process reward models (PRMs), an ORM option, and their rewards.

Our PRM is a tiny ``Qwen2ForTokenClassification`` (2 labels) of the ladder's size dial, trained
on the step checker's labels. Input text = prompt + each completion line followed by the step
separator ``"\\n"`` (appended to a last line that lacks it); the step score is the softmax
probability of label 1 ("correct") at each separator. Aggregation over steps: ``min`` (the
weakest step), ``last`` (the final line, i.e. the answer line), or ``product``. A completion
with no steps scores 0.0 (nothing to credit).

Real PRMs in the Qwen2.5-Math-PRM convention (backbone + ``score = Linear(h,h) -> ReLU ->
Linear(h,2)``, each step closed by ``<extra_0>``) load through :class:`QwenMathPRM`, built here
from transformers' ``Qwen2Model`` and the checkpoint's safetensors (the official repository
needs remote code, which RACE never runs).

Bad input: a PRM whose tokenizer maps characters of the text to its unknown token raises
``ValueError`` naming the PRM and the character (checked on a probe at load time and on every
call); a Qwen-Math PRM without ``<extra_0>`` in its vocabulary raises at load time.

FLOPs (charged to the ``reward`` phase in training, to ``eval`` in best-of-n): model FLOPs =
backbone forward over each row's real tokens (causal) + the head at every real position (the
head runs at all positions in transformers); executed = every row at the padded width with the
full attention block, head at every position.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from race import flops
from race.meter import PhaseFlops
from race.task import STEP_SEPARATOR, problem_of, split_steps, step_labels, verify

AGGREGATES = ("min", "last", "product")
QWEN_STEP_TOKEN = "<extra_0>"
PROBE_TEXT = "12+3=15\n15-4=11\n#### 11\n"


def aggregate(scores: list[float], how: str) -> float:
    """One reward from step scores; no steps -> 0.0."""
    if how not in AGGREGATES:
        raise ValueError(f"aggregate must be one of {AGGREGATES}, got {how!r}")
    if not scores:
        return 0.0
    if how == "min":
        return min(scores)
    if how == "last":
        return scores[-1]
    out = 1.0
    for s in scores:
        out *= s
    return out


def prm_text(prompt: str, completion: str, separator: str = STEP_SEPARATOR) -> tuple[str, int]:
    """(text, number of steps): each completion line closed by the separator."""
    lines = split_steps(completion)
    return prompt + "".join(line + separator for line in lines), len(lines)


class _Meter:
    """Accumulates FLOPs of reward-model forwards between ``consume`` calls."""

    def __init__(self, arch, head: str):
        self.arch, self.head = arch, head
        self.pending = PhaseFlops(0, 0, 0)

    def charge(self, lengths: list[int], width: int) -> None:
        model = sum(flops.reward_model_flops(self.arch, n, head=self.head) for n in lengths)
        executed = len(lengths) * flops.reward_model_flops(self.arch, width, head=self.head,
                                                           attention="full")
        p = self.pending
        self.pending = PhaseFlops(p.model + model, p.executed + executed, p.tokens + sum(lengths))

    def consume(self) -> PhaseFlops:
        out, self.pending = self.pending, PhaseFlops(0, 0, 0)
        return out


class ProcessRewardModel:
    """A token-classification PRM (ours): step scores at separator positions."""

    head = "token"

    def __init__(self, path: str | Path, batch_size: int = 64):
        import torch
        from transformers import AutoModelForTokenClassification

        from race.char_tokenizer import load_tokenizer

        self.name = str(path)
        self.model = AutoModelForTokenClassification.from_pretrained(
            str(path), trust_remote_code=False, use_safetensors=True,
            attn_implementation="eager", dtype=torch.float32).eval()
        self.tok = load_tokenizer(path)
        self.batch_size = batch_size
        self.arch = flops.Arch.from_config(self.model.config)
        self.meter = _Meter(self.arch, self.head)
        self.sep_id = self.tok.convert_tokens_to_ids(STEP_SEPARATOR)
        self.check_vocabulary(PROBE_TEXT)

    def check_vocabulary(self, text: str) -> None:
        ids = self.tok(text, add_special_tokens=False)["input_ids"]
        unk = self.tok.unk_token_id
        if unk is not None and unk in ids:
            bad = next(ch for ch in text if self.tok(ch, add_special_tokens=False)[
                "input_ids"] == [unk])
            raise ValueError(f"PRM {self.name}: its tokenizer does not cover the policy's "
                             f"text (character {bad!r} maps to the unknown token)")

    def _positions(self, ids: list[int]) -> list[int]:
        return [i for i, t in enumerate(ids) if t == self.sep_id]

    def step_scores(self, prompts: list[str], completions: list[str]) -> list[list[float]]:
        import torch

        out: list[list[float]] = []
        for start in range(0, len(prompts), self.batch_size):
            texts, counts, prompt_lens = [], [], []
            for p, c in zip(prompts[start:start + self.batch_size],
                            completions[start:start + self.batch_size], strict=True):
                text, n = prm_text(p, c)
                self.check_vocabulary(text)
                texts.append(text)
                counts.append(n)
                prompt_lens.append(len(self.tok(p, add_special_tokens=False)["input_ids"]))
            enc = [self.tok(t, add_special_tokens=False)["input_ids"] for t in texts]
            width = max(len(e) for e in enc)
            ids = torch.full((len(enc), width), self.tok.pad_token_id)
            mask = torch.zeros((len(enc), width), dtype=torch.long)
            for i, e in enumerate(enc):  # right padding: positions stay those of the text
                ids[i, :len(e)] = torch.tensor(e)
                mask[i, :len(e)] = 1
            with torch.no_grad():
                probs = self.model(input_ids=ids, attention_mask=mask).logits.softmax(-1)[..., 1]
            self.meter.charge([len(e) for e in enc], width)
            for i, e in enumerate(enc):
                pos = [q for q in self._positions(e) if q >= prompt_lens[i]][-counts[i]:] if (
                    counts[i]) else []
                out.append([float(probs[i, q]) for q in pos])
        return out

    def score(self, prompts, completions, aggregate: str = "min") -> list[float]:
        return [globals()["aggregate"](s, aggregate)
                for s in self.step_scores(prompts, completions)]

    def consume(self) -> PhaseFlops:
        return self.meter.consume()

    def bound(self, rows: int, max_prompt_len: int, max_completion_len: int) -> int:
        """Each row's text is at most prompt + completion + one appended separator."""
        return rows * flops.reward_model_flops(self.arch, max_prompt_len + max_completion_len + 1,
                                               head=self.head)


class QwenMathPRM(ProcessRewardModel):
    """Qwen2.5-Math-PRM convention, loaded without remote code (see the module docstring)."""

    head = "prm_mlp"

    def __init__(self, path: str | Path, batch_size: int = 16):
        import torch
        from safetensors.torch import load_file
        from transformers import AutoTokenizer, Qwen2Config, Qwen2Model

        path = Path(path)
        if not path.is_dir():
            from huggingface_hub import snapshot_download

            try:
                path = Path(snapshot_download(str(path), allow_patterns=[
                    "*.json", "*.safetensors", "*.txt", "*.model"]))
            except Exception as exc:  # offline or unknown id
                raise ValueError(f"PRM {path}: not a local directory and not downloadable "
                                 f"({type(exc).__name__})") from None
        self.name = str(path)
        raw = json.loads((path / "config.json").read_text())
        config = Qwen2Config(**{k: v for k, v in raw.items() if k not in (
            "architectures", "auto_map", "model_type")})
        config._attn_implementation = "eager"
        backbone = Qwen2Model(config)
        h = config.hidden_size
        score = torch.nn.Sequential(torch.nn.Linear(h, h), torch.nn.ReLU(),
                                    torch.nn.Linear(h, 2))
        state = {}
        for shard in sorted(path.glob("*.safetensors")):
            state.update(load_file(shard))
        backbone.load_state_dict({k[6:]: v for k, v in state.items() if k.startswith("model.")})
        score.load_state_dict({k[6:]: v for k, v in state.items() if k.startswith("score.")})
        self.backbone, self.score_head = backbone.eval(), score.eval()
        self.tok = AutoTokenizer.from_pretrained(str(path), trust_remote_code=False)
        self.sep_id = self.tok.convert_tokens_to_ids(QWEN_STEP_TOKEN)
        if self.sep_id is None or self.sep_id == self.tok.unk_token_id:
            raise ValueError(f"PRM {path}: its tokenizer has no step separator "
                             f"{QWEN_STEP_TOKEN!r}")
        self.batch_size = batch_size
        self.arch = flops.Arch.from_config(config)
        self.meter = _Meter(self.arch, self.head)
        self.model = self._forward

    def _forward(self, input_ids, attention_mask):
        hidden = self.backbone(input_ids=input_ids, attention_mask=attention_mask)[0]

        class _Out:
            logits = self.score_head(hidden)

        return _Out

    def step_scores(self, prompts, completions):
        # Same batching; the separator is <extra_0> instead of a newline.
        import race.prm as module

        original = module.prm_text
        module.prm_text = lambda p, c: original(p, c, separator=QWEN_STEP_TOKEN)
        try:
            return super().step_scores(prompts, completions)
        finally:
            module.prm_text = original


class OutcomeRewardModel:
    """A sequence classifier: reward = softmax probability of label 1 (sigmoid with 1 label)."""

    head = "sequence"

    def __init__(self, path: str | Path, batch_size: int = 64):
        import torch
        from transformers import AutoModelForSequenceClassification

        from race.char_tokenizer import load_tokenizer

        self.model = AutoModelForSequenceClassification.from_pretrained(
            str(path), trust_remote_code=False, use_safetensors=True,
            attn_implementation="eager", dtype=torch.float32).eval()
        self.tok = load_tokenizer(path)
        self.arch = flops.Arch.from_config(self.model.config)
        self.meter = _Meter(self.arch, self.head)
        self.batch_size = batch_size

    def score(self, prompts, completions, aggregate: str = "min") -> list[float]:
        import torch

        out = []
        for start in range(0, len(prompts), self.batch_size):
            texts = [p + c for p, c in zip(prompts[start:start + self.batch_size],
                                           completions[start:start + self.batch_size],
                                           strict=True)]
            enc = self.tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
            with torch.no_grad():
                logits = self.model(**enc).logits
            probs = logits.softmax(-1)[:, 1] if logits.shape[-1] > 1 else logits[:, 0].sigmoid()
            self.meter.charge(enc["attention_mask"].sum(1).tolist(), enc["input_ids"].shape[1])
            out += [float(p) for p in probs]
        return out

    def consume(self) -> PhaseFlops:
        return self.meter.consume()

    def bound(self, rows: int, max_prompt_len: int, max_completion_len: int) -> int:
        return rows * flops.reward_model_flops(self.arch, max_prompt_len + max_completion_len,
                                               head=self.head)


def load_prm(path_or_spec: str, results_dir: str = "results"):
    """A feedback model from a directory, a PRM ladder name or a hub id."""
    from race.ladder import LADDER_DIALS

    path = Path(results_dir) / "prm" / f"size~{path_or_spec}" if (
        path_or_spec in LADDER_DIALS) else Path(path_or_spec)
    if (path / "prm.json").exists():
        return ProcessRewardModel(path)
    return QwenMathPRM(path)


# --------------------------------------------------------------------------- rewards


class ModelReward:
    """``prm``, ``rule+prm`` and ``orm`` rewards: reward = (1 - w) * rule + w * model score
    (w = 1 for prm and orm)."""

    def __init__(self, scorer, name: str, aggregate: str = "min", weight: float = 1.0):
        self.scorer, self.aggregate, self.weight = scorer, aggregate, weight
        self.__name__ = name

    def __call__(self, prompts, completions, answer=None, **_) -> list[float]:
        scores = self.scorer.score(list(prompts), list(completions), aggregate=self.aggregate)
        if self.weight >= 1.0:
            return scores
        rule = [1.0 if verify(c, a) else 0.0 for c, a in zip(completions, answer, strict=True)]
        return [(1 - self.weight) * r + self.weight * s for r, s in zip(rule, scores,
                                                                           strict=True)]

    def consume(self) -> PhaseFlops:
        return self.scorer.consume()

    def bound(self, rows: int, max_prompt_len: int, max_completion_len: int) -> int:
        return self.scorer.bound(rows, max_prompt_len, max_completion_len)


def build_model_reward(spec: dict, tokenizer=None, results_dir: str = "results"):
    kind = spec["type"]
    if kind == "orm":
        return ModelReward(OutcomeRewardModel(spec["orm"]), "orm")
    scorer = load_prm(spec["prm"], results_dir)
    weight = 1.0 if kind == "prm" else float(spec.get("weight", 0.5))
    return ModelReward(scorer, kind, spec.get("aggregate", "min"), weight)


# --------------------------------------------------------------------------- training


@dataclass(frozen=True)
class PRMSpec:
    """Config keys under ``prm:`` (besides ``sizes``)."""

    n_prompts: int = 300  # train prompts the policies sample on
    samples_per_prompt: int = 2
    temperature: float = 1.0
    max_new_tokens: int = 40
    corruptions_per_prompt: int = 1  # reference solutions with one wrong step (balance)
    steps: int = 300
    batch_size: int = 32
    learning_rate: float = 3e-3
    heldout_frac: float = 0.2
    seed: int = 0

    @classmethod
    def from_config(cls, section: dict) -> PRMSpec:
        return cls(**{k: v for k, v in section.items() if k in cls.__dataclass_fields__})


def corrupt(solution: str, rng) -> str:
    """The reference solution with one digit of one line changed (a wrong step)."""
    lines = solution.split(STEP_SEPARATOR)
    i = rng.randrange(len(lines))
    digits = [j for j, ch in enumerate(lines[i]) if ch.isdigit()]
    j = digits[-1]
    lines[i] = lines[i][:j] + str((int(lines[i][j]) + rng.randint(1, 9)) % 10) + lines[i][j + 1:]
    return STEP_SEPARATOR.join(lines)


def build_examples(records, completions_per_record, tokenizer, rng):
    """(input ids, labels) per completion: label at each separator, -100 elsewhere."""
    sep = tokenizer.convert_tokens_to_ids(STEP_SEPARATOR)
    examples = []
    for record, completions in zip(records, completions_per_record, strict=True):
        problem = problem_of(record)
        for completion in completions:
            labels = step_labels(problem, completion)
            if not labels:
                continue
            text, n = prm_text(record.prompt, completion)
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            p = len(tokenizer(record.prompt, add_special_tokens=False)["input_ids"])
            pos = [q for q, t in enumerate(ids) if t == sep and q >= p][-n:]
            if len(pos) != len(labels):  # a line the tokenizer does not round-trip: skip it
                continue
            y = [-100] * len(ids)
            for q, ok in zip(pos, labels, strict=True):
                y[q] = int(ok)
            examples.append((record.prompt, ids, y))
    return examples


def auc(scores: list[float], labels: list[int]) -> float:
    """Area under the ROC curve (rank statistic; ties count one half)."""
    pos = [s for s, y in zip(scores, labels, strict=True) if y == 1]
    neg = [s for s, y in zip(scores, labels, strict=True) if y == 0]
    if not pos or not neg:
        return float("nan")
    wins = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg)
    return wins / (len(pos) * len(neg))


def train_prm(size: str, policies: list[str], data_dir: str, out_dir: str,
              spec: PRMSpec = PRMSpec()) -> dict:
    import random

    import torch
    from transformers import Qwen2ForTokenClassification

    from race.char_tokenizer import load_tokenizer
    from race.generation import generate
    from race.ladder import ladder_config, load_policy
    from race.task import load_jsonl

    t0 = time.perf_counter()
    rng = random.Random(spec.seed)
    records = load_jsonl(Path(data_dir) / "train.jsonl")[: spec.n_prompts]
    per_record = [[r.solution] + [corrupt(r.solution, rng) for _ in range(
        spec.corruptions_per_prompt)] for r in records]
    gen_flops = PhaseFlops(0, 0, 0)
    for policy_dir in policies:  # sample realistic mistakes from every base policy
        policy = load_policy(policy_dir, dtype=torch.float32)
        tok = load_tokenizer(policy_dir)
        gens = generate(policy, tok, [r.prompt for r in records], do_sample=True,
                        max_new_tokens=spec.max_new_tokens, temperature=spec.temperature,
                        seed=spec.seed, num_return_sequences=spec.samples_per_prompt)
        arch = flops.Arch.from_config(policy.config)
        for b in gens.batches:
            gen_flops = PhaseFlops(
                gen_flops.model + flops.batch_generate_flops(arch, b.prompt_lens,
                                                             b.completion_lens),
                gen_flops.executed + flops.batch_generate_flops(
                    arch, b.prompt_lens, b.completion_lens, executed=True,
                    padded_prompt_len=b.padded_prompt_len, generated_width=b.new_tokens_run),
                gen_flops.tokens + sum(b.completion_lens))
        k = spec.samples_per_prompt
        for i in range(len(records)):
            per_record[i] += gens.texts[i * k:(i + 1) * k]
    tokenizer = load_tokenizer(policies[0])
    examples = build_examples(records, per_record, tokenizer, rng)
    prompts = sorted({e[0] for e in examples})
    rng.shuffle(prompts)
    held = set(prompts[: int(len(prompts) * spec.heldout_frac)])
    train = [e for e in examples if e[0] not in held]
    test = [e for e in examples if e[0] in held]

    config = ladder_config(size, vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id)
    config.num_labels = 2
    torch.manual_seed(spec.seed)
    model = Qwen2ForTokenClassification(config)
    arch = flops.Arch.from_config(config)
    opt = torch.optim.AdamW(model.parameters(), lr=spec.learning_rate, weight_decay=0.01)
    train_model = train_exec = tokens = 0

    def batch(items):
        width = max(len(e[1]) for e in items)
        ids = torch.full((len(items), width), tokenizer.pad_token_id)
        ys = torch.full((len(items), width), -100)
        mask = torch.zeros((len(items), width), dtype=torch.long)
        for i, (_, x, y) in enumerate(items):
            ids[i, :len(x)], ys[i, :len(y)], mask[i, :len(x)] = (torch.tensor(x), torch.tensor(y),
                                                                 1)
        return ids, ys, mask, width

    model.train()
    for _ in range(spec.steps):
        items = [train[rng.randrange(len(train))] for _ in range(spec.batch_size)]
        ids, ys, mask, width = batch(items)
        loss = model(input_ids=ids, attention_mask=mask, labels=ys).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        # Full fine-tuning of the classifier: backward = 2x forward (every weight trainable).
        train_model += sum(3 * flops.reward_model_flops(arch, len(e[1])) for e in items)
        train_exec += len(items) * 3 * flops.reward_model_flops(arch, width, attention="full")
        tokens += sum(len(e[1]) for e in items)
    model.eval()
    scores, labels = [], []
    with torch.no_grad():
        for start in range(0, len(test), 64):
            ids, ys, mask, _ = batch(test[start:start + 64])
            probs = model(input_ids=ids, attention_mask=mask).logits.softmax(-1)[..., 1]
            keep = ys != -100
            scores += probs[keep].tolist()
            labels += ys[keep].tolist()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    record = {
        "phase": "pre", "size": size, "policies": policies,
        "params": sum(p.numel() for p in model.parameters()),
        "step_auc": auc(scores, labels),
        "step_accuracy": sum((s > 0.5) == bool(y) for s, y in zip(scores, labels,
                                                                 strict=True)) / len(labels),
        "heldout_steps": len(labels), "positive_rate": sum(labels) / len(labels),
        "train_examples": len(train),
        "model_flops": train_model + gen_flops.model,
        "executed_flops": train_exec + gen_flops.executed,
        "training_flops": train_model, "sampling_flops": gen_flops.model,
        "tokens": tokens, "wall_s": round(time.perf_counter() - t0, 3), "spec": asdict(spec),
    }
    (out / "prm.json").write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    return record
