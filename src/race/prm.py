"""Learned feedback models (PRMs, an ORM option), the rewards built on them, and PRM training.

Three kinds of feedback model load through :func:`load_feedback_model`, and all answer
``step_scores(prompts, completions) -> list[list[float]]``, ``score(..., aggregate)``,
``consume() -> PhaseFlops`` and ``bound(rows, max_prompt_len, max_completion_len)``:

``TokenClassifierPRM``  ours (``race prm``): a ``Qwen2ForTokenClassification`` with 2 labels.
    Text = prompt + each completion line closed by ``"\\n"`` (:func:`race.prm_data.prm_text`);
    a step's score is the softmax probability of label 1 ("correct") at the ``"\\n"`` that
    closes its line.
``QwenMathPRM``  the Qwen2.5-Math-PRM convention: transformers' ``Qwen2Model`` + ``score =
    Linear(h, h) -> ReLU -> Linear(h, 2)``; each step is closed by the token ``<extra_0>``
    instead of a newline; score = softmax probability of label 1 at each ``<extra_0>``. The
    official repository needs remote code, which RACE never runs: :class:`QwenMathPRMModule`
    rebuilds it and loads the checkpoint's safetensors (``model.*``, ``score.0.*``,
    ``score.2.*``; an ``lm_head.*`` is ignored). With a tokenizer that has a chat template
    the text is the model card's conversation (system prompt, the prompt as the user turn,
    the steps as the assistant turn); ``chat_template: false`` turns that off.
``OutcomeRewardModel``  an ORM: ``Qwen2ForSequenceClassification`` over prompt + completion
    (raw text); score = sigmoid of the logit with 1 label, softmax probability of label 1
    with 2 labels. Its ``step_scores`` is one "step" per completion, so every aggregate is
    that score.

Scores are probabilities in [0, 1]. Aggregation (:func:`aggregate`): ``min`` (the weakest
step), ``last`` (the last line: the answer line of a well-formed completion), ``product``.

Defined scores and errors (bad input):

* a completion with no non-blank line has no steps: score 0.0, step scores ``[]``, and the
  model is not run for it (nothing is charged);
* a last line without a separator gets one appended (so the answer line is scored);
* a PRM whose tokenizer maps some character of the text to its unknown token raises
  ``ValueError`` naming the PRM and the character -- checked at load on a probe text (the
  task's characters, plus the policy's whole vocabulary when a policy tokenizer of at most
  :data:`PROBE_VOCAB_LIMIT` tokens is given) and on every call;
* a step separator that is not one token of the PRM's vocabulary (``"\\n"`` for ours,
  ``<extra_0>`` for a Qwen-Math PRM) raises ``ValueError`` at load.

Batching: rows are sorted by length, cut into batches of ``batch_size``, **right-padded**
(Qwen2 numbers positions 0..T-1 whatever the mask, so right padding leaves every real token at
the position it has alone: batched scores equal unbatched ones).

FLOPs (``race.flops`` conventions; charged to the ``reward`` phase in training and to ``eval``
in best-of-n; :meth:`FeedbackModel.consume` returns and resets them):

* model FLOPs: per scored row, the backbone forward over its real tokens with causal attention
  plus the score head at every real position (transformers' heads run at every position:
  ``Linear(d, labels)`` 2·d·labels, the Qwen-Math MLP 2·d² + 4·d per position);
* executed FLOPs: every row of a batch at the padded width with the full attention block, head
  at every position (padding included), as the kernels ran it. Executed >= model; without
  padding the difference is exactly the masked upper triangle of the attention block;
* tokens: real tokens the feedback model read.

``bound(rows, P, C)`` (budget stop) = ``rows`` x the model FLOPs of one row of
``e·(P + C) + s + t`` tokens, where P, C are policy tokens, ``e`` the most PRM tokens one
policy token can become (measured over the policy's vocabulary when its tokenizer is given,
else 1: same tokenization), ``s`` the separator appended to the last line and ``t`` the chat
template's own tokens. It assumes the PRM tokenizer never splits a concatenation into more
tokens than its pieces (true for character-level and byte-level BPE tokenizers in practice).

Training (:func:`train_prm`, ``race prm``): see its docstring and :class:`PRMSpec`.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch

from race import flops
from race.meter import PhaseFlops
from race.pretrain import optimizer_step
from race.prm_data import (
    IGNORE_INDEX,
    PROBE_TEXT,
    Example,
    answer_line_flags,
    build_examples,
    encode,
    positive_rate,
    prm_text,
    sample_completions,
    shared_tokenizer,
    split_prompts,
    step_metrics,
    step_positions,
)
from race.task import STEP_SEPARATOR, split_steps

AGGREGATES = ("min", "last", "product")
QWEN_STEP_TOKEN = "<extra_0>"
#: The system turn of the Qwen2.5-Math-PRM model card's usage example.
QWEN_SYSTEM_PROMPT = "Please reason step by step, and put your final answer within \\boxed{}."
#: A policy vocabulary up to this size is probed whole at load (a character tokenizer); a
#: larger one (a BPE vocabulary) only through the task probe and the per-call check.
PROBE_VOCAB_LIMIT = 4096
_HUB_ID = re.compile(r"^[\w.-]+/[\w.-]+$")
_HUB_FILES = ["*.json", "*.safetensors", "*.txt", "*.model", "*.jinja", "tokenizer*"]


def aggregate(step_scores: Sequence[float], how: str = "min") -> float:
    """One score from a completion's step scores: ``min``, ``last`` or ``product``.
    No steps -> 0.0 (nothing to credit)."""
    if how not in AGGREGATES:
        raise ValueError(f"aggregate must be one of {AGGREGATES}, got {how!r}")
    if not step_scores:
        return 0.0
    if how == "min":
        return float(min(step_scores))
    if how == "last":
        return float(step_scores[-1])
    return float(math.prod(step_scores))


_aggregate = aggregate  # reachable inside methods whose ``aggregate`` argument shadows it


def _as_text(completion) -> str:
    """A completion as text: TRL passes strings, or message lists for conversational data
    (then the contents of the messages are joined)."""
    if isinstance(completion, str):
        return completion
    return "".join(m.get("content", "") for m in completion)


# --------------------------------------------------------------------------- FLOP ledger


class _Ledger:
    """Model / executed FLOPs and tokens of the forwards run since the last ``consume``."""

    def __init__(self, arch: flops.Arch, head: str, num_labels: int, attn_implementation: str):
        self.arch, self.head, self.num_labels = arch, head, num_labels
        self.attn_implementation = attn_implementation
        self.pending = PhaseFlops(0, 0, 0)

    def row_flops(self, n_tokens: int) -> int:
        """Model FLOPs of one row of ``n_tokens`` real tokens."""
        return flops.reward_model_flops(self.arch, n_tokens, head=self.head,
                                        num_labels=self.num_labels)

    def charge(self, lengths: list[int], width: int) -> None:
        """One batch: real tokens per row and the padded width it ran at."""
        kwargs = {"head": self.head, "num_labels": self.num_labels}
        model = flops.batch_reward_flops(self.arch, lengths, **kwargs)
        executed = flops.batch_reward_flops(self.arch, lengths, executed=True, padded_len=width,
                                            attn_implementation=self.attn_implementation,
                                            **kwargs)
        p = self.pending
        self.pending = PhaseFlops(p.model + model, p.executed + executed, p.tokens + sum(lengths))

    def consume(self) -> PhaseFlops:
        out, self.pending = self.pending, PhaseFlops(0, 0, 0)
        return out


# --------------------------------------------------------------------------- feedback models


def _device(device: str | None) -> str:
    return device or ("cuda" if torch.cuda.is_available() else "cpu")


def _dtype(dtype: str | None, device: str):
    """Weights dtype: float32 on a CPU unless told; the checkpoint's own ("auto") elsewhere."""
    if dtype is None:
        return torch.float32 if device == "cpu" else "auto"
    return dtype if dtype == "auto" else getattr(torch, dtype)


class FeedbackModel:
    """Shared scoring loop; subclasses set the model, the text format and the score head.

    Subclass contract: ``self.model`` (called as ``model(input_ids=, attention_mask=)``,
    returning ``.logits``), ``self.tokenizer``, ``self.separator`` (text closing each step;
    None for an ORM), ``_format(prompt, completion) -> (text, n_steps)`` and
    ``_positive(logits) -> (rows, positions)`` probabilities.
    """

    kind = "prm"
    head = "token"
    separator: str | None = STEP_SEPARATOR

    def _setup(self, name: str, *, num_labels: int, attn_implementation: str,
               batch_size: int, policy_tokenizer=None, template_tokens: int = 0) -> None:
        """Checks and ledger, once ``model`` and ``tokenizer`` are set (see the module
        docstring for the checks and for ``bound``)."""
        if batch_size < 1:
            raise ValueError(f"{name}: batch_size must be >= 1, got {batch_size}")
        self.name, self.batch_size = name, batch_size
        self.pad_id = self.tokenizer.pad_token_id
        if self.pad_id is None:  # pads are masked out: any id works for a PRM
            self.pad_id = self.tokenizer.eos_token_id or 0
        self.sep_id = self._separator_id()
        self.arch = flops.Arch.from_config(self.model.config)
        self.ledger = _Ledger(self.arch, self.head, num_labels, attn_implementation)
        self.template_tokens = template_tokens
        self.tokenize(probe_text(policy_tokenizer))  # fail at load, not mid-training
        self.expansion = self._expansion(policy_tokenizer)

    # ------------------------------------------------------------------ checks
    def _separator_id(self) -> int | None:
        if self.separator is None:
            return None
        vocab = self.tokenizer.get_vocab()
        ids = self.tokenizer(self.separator, add_special_tokens=False)["input_ids"]
        if self.separator not in vocab or ids != [vocab[self.separator]]:
            raise ValueError(f"feedback model {self.name}: its tokenizer has no step separator "
                             f"token {self.separator!r} (a step must end with that one token)")
        return vocab[self.separator]

    def tokenize(self, text: str) -> list[int]:
        """Token ids of ``text`` (no special tokens added); ``ValueError`` naming this model and
        a character when the tokenizer maps some character of ``text`` to its unknown token."""
        unk = self.tokenizer.unk_token_id
        if unk is None or not self.tokenizer.is_fast:  # no unknown token (byte-level BPE)
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            if unk is not None and unk in ids:
                bad = next(ch for ch in text if unk in self.tokenizer(
                    ch, add_special_tokens=False)["input_ids"])
                self._uncovered(bad)
            return ids
        enc = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        for tok, (lo, hi) in zip(enc["input_ids"], enc["offset_mapping"], strict=True):
            if tok == unk:
                self._uncovered(text[lo:hi][:1])
        return enc["input_ids"]

    def _uncovered(self, char: str):
        raise ValueError(f"feedback model {self.name}: its tokenizer does not cover the "
                         f"policy's text: {char!r} maps to the unknown token "
                         f"{self.tokenizer.unk_token!r}")

    def _expansion(self, policy_tokenizer) -> int:
        """Most tokens of this model per policy token (1 without a policy tokenizer)."""
        if policy_tokenizer is None:
            return 1
        pieces = _vocabulary_texts(policy_tokenizer)
        if self.separator is not None:  # newlines become separators in the step text
            pieces += [p.replace(STEP_SEPARATOR, self.separator) for p in pieces]
        lengths = self.tokenizer(pieces, add_special_tokens=False)["input_ids"] if pieces else []
        return max([1] + [len(ids) for ids in lengths])

    # ------------------------------------------------------------------ scoring
    def _format(self, prompt: str, completion: str) -> tuple[str, int]:
        return prm_text(prompt, completion, self.separator)

    def _encode(self, prompt: str, completion: str) -> tuple[list[int], list[int]] | None:
        """(ids, score positions) of one row, or None when the completion has no step."""
        text, n = self._format(prompt, _as_text(completion))
        if n == 0:
            return None
        ids = self.tokenize(text)
        return ids, step_positions(ids, self.sep_id, n)

    def _run(self, rows: list[list[int]]):
        """Positive-label probabilities of one right-padded batch (a CPU tensor)."""
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, :len(r)] = torch.tensor(r)
            mask[i, :len(r)] = 1
        device = next(self.model.parameters()).device
        with torch.no_grad():
            logits = self.model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits
        self.ledger.charge([len(r) for r in rows], width)
        return self._positive(logits.float()).cpu()

    def _positive(self, logits):
        return logits.softmax(-1)[..., 1]

    def step_scores(self, prompts: Sequence[str], completions: Sequence) -> list[list[float]]:
        """Per completion, the probability that each step is correct (``[]``: no steps)."""
        if len(prompts) != len(completions):
            raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions")
        rows = [self._encode(p, c) for p, c in zip(prompts, completions, strict=True)]
        out: list[list[float]] = [[] for _ in rows]
        todo = sorted((i for i, r in enumerate(rows) if r is not None),
                      key=lambda i: len(rows[i][0]))  # similar lengths together: less padding
        for start in range(0, len(todo), self.batch_size):
            chunk = todo[start:start + self.batch_size]
            probs = self._run([rows[i][0] for i in chunk])
            for b, i in enumerate(chunk):
                out[i] = [float(probs[b, q]) for q in rows[i][1]]
        return out

    def score(self, prompts: Sequence[str], completions: Sequence,
              aggregate: str = "min") -> list[float]:
        """One score per completion: its step scores aggregated (no steps -> 0.0)."""
        if aggregate not in AGGREGATES:
            raise ValueError(f"aggregate must be one of {AGGREGATES}, got {aggregate!r}")
        return [_aggregate(s, aggregate) for s in self.step_scores(prompts, completions)]

    def consume(self) -> PhaseFlops:
        """FLOPs and tokens of the forwards since the last call (then reset to zero)."""
        return self.ledger.consume()

    def bound(self, rows: int, max_prompt_len: int, max_completion_len: int) -> int:
        """Most model FLOPs one call on ``rows`` completions can cost (module docstring)."""
        appended = 1 if self.separator is not None else 0
        n = self.expansion * (max_prompt_len + max_completion_len) + appended
        return rows * self.ledger.row_flops(n + self.template_tokens)


def _vocabulary_texts(tokenizer) -> list[str]:
    """The decoded text of every non-special token of ``tokenizer``."""
    special = set(tokenizer.all_special_ids)
    ids = [i for i in range(len(tokenizer)) if i not in special]
    return [t for t in tokenizer.batch_decode([[i] for i in ids]) if t]


def probe_text(policy_tokenizer=None) -> str:
    """The load-time vocabulary probe: the task's characters, plus every token of a policy
    vocabulary of at most :data:`PROBE_VOCAB_LIMIT` tokens."""
    if policy_tokenizer is None or len(policy_tokenizer) > PROBE_VOCAB_LIMIT:
        return PROBE_TEXT
    return PROBE_TEXT + "".join(_vocabulary_texts(policy_tokenizer))


@contextmanager
def _quiet_transformers():
    """transformers' warnings off inside the block (expected load-report entries)."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)


def _check_loaded(name: str, info: dict) -> None:
    missing = info.get("missing_keys") or []
    if missing:
        raise ValueError(f"feedback model {name}: checkpoint lacks weights {sorted(missing)[:5]}")


def _load_classifier(model_class, path: str | Path, name: str, attn_implementation: str,
                     device: str, dtype: str | None):
    """A safetensors classifier checkpoint (no remote code), every weight present."""
    model, info = model_class.from_pretrained(
        str(path), use_safetensors=True, attn_implementation=attn_implementation,
        dtype=_dtype(dtype, device), output_loading_info=True)
    _check_loaded(name, info)
    return model


class TokenClassifierPRM(FeedbackModel):
    """Our PRM: ``Qwen2ForTokenClassification`` (2 labels), steps closed by ``"\\n"``."""

    def __init__(self, path: str | Path, *, name: str | None = None, batch_size: int = 64,
                 attn_implementation: str = "sdpa", device: str | None = None,
                 dtype: str | None = None, policy_tokenizer=None):
        from transformers import Qwen2ForTokenClassification

        from race.char_tokenizer import load_tokenizer

        name = name or str(path)
        device = _device(device)
        model = _load_classifier(Qwen2ForTokenClassification, path, name, attn_implementation,
                                 device, dtype)
        if model.config.num_labels != 2:
            raise ValueError(f"PRM {name}: a token-classification PRM needs 2 labels, "
                             f"got {model.config.num_labels}")
        self.model = model.to(device).eval()
        self.tokenizer = load_tokenizer(path)
        self._setup(name, num_labels=2, attn_implementation=attn_implementation,
                    batch_size=batch_size, policy_tokenizer=policy_tokenizer)


class OutcomeRewardModel(FeedbackModel):
    """An ORM: ``Qwen2ForSequenceClassification`` over prompt + completion (raw text)."""

    kind = "orm"
    head = "sequence"
    separator = None

    def __init__(self, path: str | Path, *, name: str | None = None, batch_size: int = 64,
                 attn_implementation: str = "sdpa", device: str | None = None,
                 dtype: str | None = None, policy_tokenizer=None):
        from transformers import Qwen2ForSequenceClassification

        from race.char_tokenizer import load_tokenizer

        name = name or str(path)
        device = _device(device)
        model = _load_classifier(Qwen2ForSequenceClassification, path, name,
                                 attn_implementation, device, dtype)
        if model.config.num_labels not in (1, 2):
            raise ValueError(f"ORM {name}: needs 1 label (sigmoid) or 2 (softmax), "
                             f"got {model.config.num_labels}")
        self.tokenizer = load_tokenizer(path)
        if model.config.pad_token_id is None:  # it pools the last non-pad token of each row
            model.config.pad_token_id = self.tokenizer.pad_token_id
        self.model = model.to(device).eval()
        self._setup(name, num_labels=model.config.num_labels,
                    attn_implementation=attn_implementation, batch_size=batch_size,
                    policy_tokenizer=policy_tokenizer)
        self.pad_id = model.config.pad_token_id

    def _format(self, prompt: str, completion: str) -> tuple[str, int]:
        return prompt + completion, 1 if split_steps(completion) else 0

    def _encode(self, prompt, completion):
        text, n = self._format(prompt, _as_text(completion))
        if n == 0:
            return None
        return self.tokenize(text), [0]

    def _positive(self, logits):  # pooled: (rows, labels) -> (rows, 1)
        probs = logits.sigmoid() if logits.shape[-1] == 1 else logits.softmax(-1)[:, 1:]
        return probs


# --------------------------------------------------------------------------- Qwen-Math PRM


class QwenMathPRMModule(torch.nn.Module):
    """Qwen2.5-Math-PRM without remote code: ``model`` (transformers' ``Qwen2Model``) and
    ``score = Sequential(Linear(h, h), ReLU(), Linear(h, 2))``; ``forward`` returns an object
    whose ``.logits`` are the head's output at every position, shape (batch, seq, 2)."""

    def __init__(self, config, backbone=None):
        from transformers import Qwen2Model

        super().__init__()
        self.config = config
        self.model = backbone if backbone is not None else Qwen2Model(config)
        h = config.hidden_size
        self.score = torch.nn.Sequential(torch.nn.Linear(h, h), torch.nn.ReLU(),
                                         torch.nn.Linear(h, 2))

    def forward(self, input_ids, attention_mask=None):
        from transformers.modeling_outputs import TokenClassifierOutput

        hidden = self.model(input_ids=input_ids, attention_mask=attention_mask,
                            use_cache=False).last_hidden_state
        return TokenClassifierOutput(logits=self.score(hidden))

    @classmethod
    def from_pretrained(cls, path: str | Path, *, attn_implementation: str = "sdpa",
                        dtype="auto", name: str | None = None) -> QwenMathPRMModule:
        """Backbone through ``Qwen2Model.from_pretrained`` (it strips the ``model.`` prefix;
        every backbone weight must be present), head from the ``score.0.*`` / ``score.2.*``
        tensors of the checkpoint's safetensors shards."""
        from safetensors import safe_open
        from transformers import Qwen2Model

        path, name = Path(path), name or str(path)
        with _quiet_transformers():  # its load report lists the score.* keys loaded below
            backbone, info = Qwen2Model.from_pretrained(
                str(path), use_safetensors=True, attn_implementation=attn_implementation,
                dtype=dtype, output_loading_info=True)
        _check_loaded(name, info)
        module = cls(backbone.config, backbone)
        head = {}
        for shard in sorted(path.glob("*.safetensors")):
            with safe_open(str(shard), framework="pt") as f:
                head.update({k[len("score."):]: f.get_tensor(k) for k in f.keys()
                             if k.startswith("score.")})
        want = set(module.score.state_dict())
        if set(head) != want:
            found = sorted("score." + k for k in head)
            raise ValueError(f"PRM {name}: expected head weights score.{{0,2}}.{{weight,bias}} "
                             f"(Linear -> ReLU -> Linear), found {found}")
        module.score.load_state_dict(head)
        return module.to(next(backbone.parameters()).dtype)

    def save_pretrained(self, out_dir: str | Path) -> None:
        """config.json + model.safetensors with the official key names."""
        from safetensors.torch import save_file

        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        self.config.architectures = ["Qwen2ForProcessRewardModel"]
        self.config.save_pretrained(out)
        state = {k: v.contiguous() for k, v in self.state_dict().items()}
        save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})


class QwenMathPRM(FeedbackModel):
    """A PRM in the Qwen2.5-Math-PRM convention (module docstring)."""

    head = "prm_mlp"
    separator = QWEN_STEP_TOKEN

    def __init__(self, path: str | Path, *, name: str | None = None, batch_size: int = 16,
                 attn_implementation: str = "sdpa", device: str | None = None,
                 dtype: str | None = None, policy_tokenizer=None,
                 chat_template: bool | None = None):
        from race.char_tokenizer import load_tokenizer

        name = name or str(path)
        device = _device(device)
        self.tokenizer = load_tokenizer(path)
        if QWEN_STEP_TOKEN not in self.tokenizer.get_vocab():  # before loading 7B of weights
            raise ValueError(f"PRM {name}: its tokenizer has no step separator token "
                             f"{QWEN_STEP_TOKEN!r}")
        has_template = bool(getattr(self.tokenizer, "chat_template", None))
        if chat_template and not has_template:
            raise ValueError(f"PRM {name}: chat_template requested but its tokenizer has none")
        self.chat = has_template if chat_template is None else chat_template
        module = QwenMathPRMModule.from_pretrained(
            path, attn_implementation=attn_implementation, dtype=_dtype(dtype, device),
            name=name)
        self.model = module.to(device).eval()
        template = len(self.tokenizer(self._conversation("", ""),
                                      add_special_tokens=False)["input_ids"]) if self.chat else 0
        self._setup(name, num_labels=2, attn_implementation=attn_implementation,
                    batch_size=batch_size, policy_tokenizer=policy_tokenizer,
                    template_tokens=template)

    def _conversation(self, prompt: str, body: str) -> str:
        messages = [{"role": "system", "content": QWEN_SYSTEM_PROMPT},
                    {"role": "user", "content": prompt},
                    {"role": "assistant", "content": body}]
        return self.tokenizer.apply_chat_template(messages, tokenize=False,
                                                  add_generation_prompt=False)

    def _format(self, prompt: str, completion: str) -> tuple[str, int]:
        if not self.chat:
            return prm_text(prompt, completion, QWEN_STEP_TOKEN)
        lines = split_steps(completion)
        return self._conversation(prompt, "".join(ln + QWEN_STEP_TOKEN for ln in lines)), len(
            lines)


# --------------------------------------------------------------------------- loading


def resolve_model_dir(spec: str | Path, results_dir: str | Path = "results") -> Path:
    """A local directory for a feedback-model spec: a PRM ladder name ->
    ``results_dir/prm/size~NAME``; an existing directory -> itself; a hub id (``org/name``)
    -> ``huggingface_hub.snapshot_download`` (``ValueError`` when the hub is unreachable)."""
    from race.ladder import LADDER_DIALS

    text = str(spec)
    if text in LADDER_DIALS:
        path = Path(results_dir) / "prm" / f"size~{text}"
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"PRM {text!r}: {path} holds no trained PRM; train it with "
                                    f"`race prm --size {text} ...` (the workflow's prm rule)")
        return path
    path = Path(text)
    if path.is_dir():
        return path
    if not _HUB_ID.match(text):
        raise FileNotFoundError(f"feedback model {text!r}: not a PRM ladder name "
                                f"({', '.join(LADDER_DIALS)}), a directory or a hub id")
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(text, allow_patterns=_HUB_FILES))
    except Exception as exc:  # offline, unknown id, gated repository: all end here
        reason = (str(exc).splitlines() or [""])[0][:200]
        raise ValueError(
            f"feedback model {text!r}: not a local directory, and the Hugging Face hub did not "
            f"provide it ({type(exc).__name__}: {reason}). "
            f"Download it where the hub is reachable (`hf download {text} --local-dir DIR`) "
            "and pass DIR instead.") from None


def model_kind(path: str | Path) -> str:
    """``token`` (ours), ``qwen_math`` or ``orm``, from config.json's ``architectures`` (and
    the safetensors head names when that is inconclusive)."""
    path = Path(path)
    config = path / "config.json"
    if not config.is_file():
        raise FileNotFoundError(f"feedback model directory {path} has no config.json")
    archs = json.loads(config.read_text()).get("architectures") or []
    for arch in archs:
        if arch.endswith("ForTokenClassification"):
            return "token"
        if arch.endswith("ForSequenceClassification"):
            return "orm"
        if arch.endswith("ForProcessRewardModel"):
            return "qwen_math"
    from safetensors import safe_open

    for shard in sorted(path.glob("*.safetensors")):
        with safe_open(str(shard), framework="pt") as f:
            if "score.2.weight" in f.keys():
                return "qwen_math"
    raise ValueError(f"feedback model {path}: cannot tell its kind (architectures {archs}); "
                     "expected a token classifier, a sequence classifier or a Qwen-Math PRM")


#: Options a ``rewards:`` entry (or ``load_feedback_model``) may set for the model itself.
MODEL_OPTIONS = ("batch_size", "attn_implementation", "device", "dtype", "chat_template")


def load_feedback_model(spec_or_path, results_dir: str | Path = "results", *,
                        policy_tokenizer=None, **options) -> FeedbackModel:
    """A feedback model from a ladder name, a directory, a hub id, or a ``rewards:`` entry
    (a dict: its ``prm`` or ``orm`` key names the model, :data:`MODEL_OPTIONS` keys pass
    through). The kind comes from the checkpoint (:func:`model_kind`)."""
    if isinstance(spec_or_path, dict):
        spec = spec_or_path
        target = spec.get("prm") or spec.get("orm")
        if target is None:
            raise ValueError(f"feedback model spec {spec} names no model (a prm or orm key)")
        options = {**{k: spec[k] for k in MODEL_OPTIONS if k in spec}, **options}
    else:
        target = spec_or_path
    unknown = sorted(set(options) - set(MODEL_OPTIONS))
    if unknown:
        raise TypeError(f"unknown feedback-model option(s) {unknown}; known: {MODEL_OPTIONS}")
    path = resolve_model_dir(target, results_dir)
    kind = model_kind(path)
    common = {"name": str(target), "policy_tokenizer": policy_tokenizer, **options}
    if kind == "qwen_math":
        return QwenMathPRM(path, **common)
    common.pop("chat_template", None)
    if kind == "orm":
        return OutcomeRewardModel(path, **common)
    return TokenClassifierPRM(path, **common)


def load_prm(path_or_spec, results_dir: str | Path = "results") -> FeedbackModel:
    """For best-of-n reranking: an object with ``score(prompts, completions, aggregate="min")
    -> list[float]`` and ``consume() -> PhaseFlops`` (the eval FLOPs of scoring). Accepts
    what :func:`load_feedback_model` accepts."""
    return load_feedback_model(path_or_spec, results_dir)


# --------------------------------------------------------------------------- rewards


class FeedbackReward:
    """A TRL reward function backed by a feedback model (``prm``, ``rule+prm``, ``orm``).

    ``prm``: reward = aggregate(step scores). ``orm``: reward = the ORM's score.
    ``rule+prm``: reward = (1 - w) * rule + w * aggregate(step scores), rule = 1.0 for a
    verified final answer else 0.0, ``w`` = ``weight`` in [0, 1] -- so the reward stays in
    [0, 1]. With ``w = 0`` the PRM is not run (and nothing is charged). Every reward is a
    probability-like value in [0, 1]; a completion without steps scores 0.0 from the model.
    """

    def __init__(self, model: FeedbackModel, kind: str, *, aggregate: str = "min",
                 weight: float = 1.0, verifier: str = "task"):
        if aggregate not in AGGREGATES:
            raise ValueError(f"rewards: aggregate must be one of {AGGREGATES}, got {aggregate!r}")
        if not 0.0 <= weight <= 1.0:
            raise ValueError(f"rewards: weight must be in [0, 1], got {weight}")
        self.model, self.kind, self.aggregate, self.weight = model, kind, aggregate, weight
        self.__name__ = kind
        self.rule = None
        if kind == "rule+prm":
            from race.rewards import RuleReward

            self.rule = RuleReward(math_verifier=verifier == "math")

    def __call__(self, prompts, completions, answer=None, **kwargs) -> list[float]:
        prompts, completions = list(prompts), [_as_text(c) for c in completions]
        if self.rule is None:
            return self.model.score(prompts, completions, aggregate=self.aggregate)
        if answer is None:
            raise ValueError("rule+prm reward: needs the dataset's answer column")
        rule = self.rule(prompts, completions, answer)
        if self.weight == 0.0:
            return rule
        model = self.model.score(prompts, completions, aggregate=self.aggregate)
        return combine(rule, model, self.weight)

    def consume(self) -> PhaseFlops:
        return self.model.consume()

    def bound(self, rows: int, max_prompt_len: int, max_completion_len: int) -> int:
        if self.rule is not None and self.weight == 0.0:
            return 0
        return self.model.bound(rows, max_prompt_len, max_completion_len)


def combine(rule: Sequence[float], model: Sequence[float], weight: float) -> list[float]:
    """``rule+prm``: (1 - weight) * rule + weight * model, elementwise."""
    return [(1.0 - weight) * r + weight * m for r, m in zip(rule, model, strict=True)]


def build_model_reward(spec: dict, tokenizer=None, results_dir: str | Path | None = "results"):
    """The reward object for a ``rewards:`` entry of type ``prm``, ``rule+prm`` or ``orm``.

    Keys: ``prm`` / ``orm`` (ladder name, directory or hub id), ``aggregate`` (min),
    ``weight`` (rule+prm, 0.5), ``verifier`` (rule+prm: task | math), and the model options
    :data:`MODEL_OPTIONS`. ``tokenizer`` is the policy's (vocabulary probe and ``bound``).
    """
    kind = spec.get("type")
    if kind not in ("prm", "rule+prm", "orm"):
        raise ValueError(f"rewards: {kind!r} is not a feedback-model reward (prm, rule+prm, orm)")
    key = "orm" if kind == "orm" else "prm"
    if not spec.get(key):
        raise ValueError(f"rewards: a {kind} reward needs the {key!r} key")
    model = load_feedback_model({key: spec[key], **{k: spec[k] for k in MODEL_OPTIONS
                                                     if k in spec}},
                                results_dir or "results", policy_tokenizer=tokenizer)
    if (model.kind == "orm") != (kind == "orm"):
        raise ValueError(f"rewards: {spec[key]!r} is a{'n ORM' if model.kind == 'orm' else ' PRM'}"
                         f", not usable as a {kind} reward")
    return FeedbackReward(model, kind, aggregate=spec.get("aggregate", "min"),
                          weight=1.0 if kind != "rule+prm" else float(spec.get("weight", 0.5)),
                          verifier=spec.get("verifier", "task"))


# --------------------------------------------------------------------------- training


@dataclass(frozen=True)
class PRMSpec:
    """Config keys under ``prm:`` (besides ``sizes``); see :func:`train_prm`."""

    n_prompts: int = 400  # train-split prompts the base policies sample on
    samples_per_prompt: int = 4  # completions per prompt per base policy
    temperature: float = 1.0  # sampling temperature (1.0: the policies' own mistakes)
    max_new_tokens: int = 48  # completion cap when sampling
    sample_batch_size: int = 64
    target_positive_rate: float = 0.6  # balance synthetic data towards this step rate ...
    balance_tolerance: float = 0.1  # ... when the samples are farther than this from it
    heldout_frac: float = 0.2  # prompts held out for AUC / accuracy
    steps: int = 400  # optimizer steps
    batch_size: int = 32  # completions per step
    learning_rate: float = 3e-4  # AdamW peak; linear warmup then cosine to 10%
    warmup_frac: float = 0.05
    weight_decay: float = 0.01
    init: str = "auto"  # random | base | auto (base when a same-size base policy is given)
    attn_implementation: str = "sdpa"
    seed: int = 0

    def __post_init__(self):
        if self.init not in ("auto", "base", "random"):
            raise ValueError(f"prm.init must be auto, base or random, got {self.init!r}")
        for key in ("n_prompts", "samples_per_prompt", "max_new_tokens", "sample_batch_size",
                    "steps", "batch_size"):
            if int(getattr(self, key)) < 1:
                raise ValueError(f"prm.{key} must be >= 1, got {getattr(self, key)}")
        if not 0 <= self.heldout_frac < 1:
            raise ValueError(f"prm.heldout_frac must be in [0, 1), got {self.heldout_frac}")
        if not 0 < self.target_positive_rate < 1:
            raise ValueError("prm.target_positive_rate must be in (0, 1)")

    @classmethod
    def from_config(cls, section: dict | None) -> PRMSpec:
        """From the config's ``prm:`` section (``sizes`` is the workflow's, not ours)."""
        section = {k: v for k, v in (section or {}).items() if k != "sizes"}
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(section) - known)
        if unknown:
            raise ValueError(f"prm: unknown key(s) {unknown}; known: {sorted(known)}")
        return cls(**section)


def prm_train_flops(arch: flops.Arch, n_tokens: int, attention: str = "causal") -> int:
    """Forward + backward of full fine-tuning of a 2-label token classifier over one row: the
    backbone (``flops.train_flops`` without LM head) plus 3x the head at every position
    (forward, input gradient, weight gradient)."""
    backbone = flops.train_flops(arch, n_tokens, logits=0, attention=attention)
    return backbone + 3 * flops.reward_head_flops(arch, n_tokens, head="token", num_labels=2)


def _lr(step: int, spec: PRMSpec) -> float:
    """Linear warmup over ``warmup_frac`` of the steps, then cosine decay to 10% of the peak."""
    warm = max(1, int(spec.warmup_frac * spec.steps))
    if step < warm:
        return spec.learning_rate * (step + 1) / warm
    progress = (step - warm) / max(1, spec.steps - warm)
    return spec.learning_rate * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def _collate(rows: list[tuple[list[int], list[int]]], pad_id: int):
    """Right-padded (ids, targets, mask) tensors of encoded examples."""
    width = max(len(ids) for ids, _ in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    targets = torch.full((len(rows), width), IGNORE_INDEX, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (x, y) in enumerate(rows):
        ids[i, :len(x)], targets[i, :len(y)], mask[i, :len(x)] = (
            torch.tensor(x), torch.tensor(y), 1)
    return ids, targets, mask


def fit(model, train: list[tuple[list[int], list[int]]], spec: PRMSpec, pad_id: int) -> dict:
    """Full fine-tuning: ``spec.steps`` AdamW steps on seeded epochs of ``train`` (encoded
    examples), cross-entropy at the step-separator positions only (every other target is
    :data:`IGNORE_INDEX`). Returns the loss and the pre FLOPs (model: real tokens, causal;
    executed: padded batch, the attention kernel's block) and tokens."""
    arch = flops.Arch.from_config(model.config)
    attention = "full" if spec.attn_implementation == "eager" else "sdpa"
    gen = torch.Generator().manual_seed(spec.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=spec.learning_rate,
                            weight_decay=spec.weight_decay)
    order: list[int] = []
    model_flops = executed = tokens = 0
    losses: list[float] = []
    model.train()
    for step in range(spec.steps):
        if len(order) < spec.batch_size:  # a new seeded epoch (the tail of the last one kept)
            order += torch.randperm(len(train), generator=gen).tolist()
        batch = [train[i] for i in order[:spec.batch_size]]
        order = order[spec.batch_size:]
        ids, targets, mask = _collate(batch, pad_id)
        loss = optimizer_step(model, opt, _lr(step, spec),
                              input_ids=ids, attention_mask=mask, labels=targets)
        losses.append(float(loss.detach()))
        lengths = [len(x) for x, _ in batch]
        model_flops += sum(prm_train_flops(arch, n) for n in lengths)
        executed += len(batch) * prm_train_flops(arch, ids.shape[1], attention)
        tokens += sum(lengths)
    model.eval()
    tail = losses[-max(1, len(losses) // 10):]
    return {"final_loss": sum(tail) / len(tail), "training": PhaseFlops(model_flops, executed,
                                                                        tokens)}


def predict(model, encoded: list[tuple[list[int], list[int]]], pad_id: int,
            batch_size: int = 64) -> tuple[list[float], list[int]]:
    """(positive probabilities, labels) at every labelled position of ``encoded``."""
    scores: list[float] = []
    labels: list[int] = []
    with torch.no_grad():
        for start in range(0, len(encoded), batch_size):
            ids, targets, mask = _collate(encoded[start:start + batch_size], pad_id)
            probs = model(input_ids=ids, attention_mask=mask).logits.softmax(-1)[..., 1]
            keep = targets != IGNORE_INDEX
            scores += probs[keep].tolist()
            labels += targets[keep].tolist()
    return scores, labels


def init_classifier(size: str, tokenizer, policies: Sequence[str], spec: PRMSpec):
    """(2-label token classifier of ladder size ``size``, where its weights came from).

    ``spec.init``: ``random`` -- a fresh ``ladder_config(size, vocab)`` model; ``base`` -- the
    backbone of the base policy in ``policies`` with that very architecture (its LM head is
    dropped, the score head is new), as real PRMs start from a policy checkpoint; ``auto`` --
    ``base`` when such a policy is given, else ``random``. Seeded by ``spec.seed``.
    """
    from transformers import Qwen2ForTokenClassification

    from race.ladder import ladder_config

    config = ladder_config(size, vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                           bos_token_id=tokenizer.bos_token_id,
                           eos_token_id=tokenizer.eos_token_id)
    config.num_labels = 2
    want = flops.Arch.from_config(config)
    same = [p for p in policies
            if flops.Arch.from_config(json.loads((Path(p) / "config.json").read_text())) == want]
    if spec.init == "base" and not same:
        raise ValueError(f"prm.init is 'base' but no base policy of size {size!r} is among "
                         f"{list(policies)}")
    torch.manual_seed(spec.seed)
    if spec.init != "random" and same:
        with _quiet_transformers():  # its load report lists the new score head as missing
            model = Qwen2ForTokenClassification.from_pretrained(
                same[0], num_labels=2, use_safetensors=True,
                attn_implementation=spec.attn_implementation, dtype=torch.float32)
        return model, same[0]
    config._attn_implementation = spec.attn_implementation
    return Qwen2ForTokenClassification(config), "random"


def heldout_metrics(model, tokenizer, examples: list[Example]) -> dict:
    """Step metrics (:func:`race.prm_data.step_metrics`) of held-out examples: ``sampled``
    (the policies' completions: what the PRM scores in RL), ``sampled_no_answer`` (their
    step lines only: the answer line is correct whenever it repeats the last stated result,
    an easy positive) and ``all`` (synthetic examples included)."""
    sampled = [e for e in examples if e.source == "sample"]
    out = {}
    for key, subset in (("sampled", sampled), ("all", examples)):
        scores, labels = predict(model, [encode(tokenizer, e) for e in subset],
                                 tokenizer.pad_token_id) if subset else ([], [])
        out[key] = step_metrics(scores, labels)
        if key == "sampled":
            keep = [not a for a in answer_line_flags(subset)]
            out["sampled_no_answer"] = step_metrics(
                [s for s, k in zip(scores, keep, strict=True) if k],
                [y for y, k in zip(labels, keep, strict=True) if k])
    return out


def _phase(p: PhaseFlops) -> dict:
    return {"model_flops": p.model, "executed_flops": p.executed, "tokens": p.tokens}


def train_prm(size: str, policies: Sequence[str | Path], data_dir: str | Path,
              out_dir: str | Path, spec: PRMSpec = PRMSpec()) -> dict:
    """Train PRM ladder size ``size`` on step labels; returns the ``prm.json`` record
    (metrics that are undefined -- one class only among the held-out steps -- are None).

    1. the first ``n_prompts`` train-split prompts; each base policy in ``policies`` samples
       ``samples_per_prompt`` completions per prompt (``temperature``), so the PRM sees the
       policies' real mistakes;
    2. the step checker labels every line; repeats are dropped; synthetic reference
       solutions or corruptions are added only to bring the step positive rate near
       ``target_positive_rate`` (:func:`build_examples`);
    3. the prompts are split (seeded, ``heldout_frac`` held out), so no held-out prompt is
       trained on;
    4. a ``Qwen2ForTokenClassification`` of ``ladder_config(size, vocab)`` with 2 labels --
       random init, or the same-size base policy's backbone (``init``,
       :func:`init_classifier`) -- is fully fine-tuned for ``steps`` AdamW steps, loss =
       cross-entropy at the step separators only;
    5. held-out step AUC and accuracy at 0.5, on the policies' samples (``auc``,
       ``accuracy``: what the PRM scores in RL) and on every held-out example (``all``).

    Output: ``model.safetensors`` + ``config.json`` + tokenizer (``save_pretrained``),
    ``prm.json`` (metrics, the ``pre`` FLOPs of sampling and of training, model and executed,
    tokens, wall seconds, the spec) and ``samples.jsonl`` (every example with its labels,
    source and split). Deterministic for a seed (and thread count).
    """

    from race.ladder import count_parameters
    from race.task import load_jsonl, write_jsonl

    t0 = time.perf_counter()
    policies = [str(p) for p in policies]
    if not policies:
        raise ValueError("race prm: needs at least one base policy directory")
    tokenizer = shared_tokenizer(policies)
    records = load_jsonl(Path(data_dir) / "train.jsonl")[: spec.n_prompts]
    samples, sampling = sample_completions(
        policies, [r.prompt for r in records], per_prompt=spec.samples_per_prompt,
        max_new_tokens=spec.max_new_tokens, temperature=spec.temperature, seed=spec.seed,
        batch_size=spec.sample_batch_size)
    examples = build_examples(records, samples, target=spec.target_positive_rate,
                              tolerance=spec.balance_tolerance, seed=spec.seed)
    held = split_prompts([r.prompt for r in records], spec.heldout_frac, spec.seed)
    train_ex = [e for e in examples if e.prompt not in held]
    test_ex = [e for e in examples if e.prompt in held]
    if not train_ex:
        raise ValueError("race prm: no training example (raise prm.n_prompts)")

    model, init = init_classifier(size, tokenizer, policies, spec)
    pad = tokenizer.pad_token_id
    fitted = fit(model, [encode(tokenizer, e) for e in train_ex], spec, pad)

    metrics = heldout_metrics(model, tokenizer, test_ex)

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    write_jsonl(out / "samples.jsonl", (
        {"prompt": e.prompt, "completion": e.completion, "labels": [int(x) for x in e.labels],
         "source": e.source, "split": "heldout" if e.prompt in held else "train"}
        for e in examples))
    training = fitted["training"]
    params, non_embedding = count_parameters(model)
    record = {
        "phase": "pre",
        "size": size,
        "policies": policies,
        "init": init,
        "params": params,
        "non_embedding_params": non_embedding,
        "auc": metrics["sampled"]["auc"],
        "accuracy": metrics["sampled"]["accuracy"],
        "steps": metrics["sampled"]["steps"],
        "positive_rate": metrics["sampled"]["positive_rate"],
        "heldout": metrics,
        "examples": {"train": len(train_ex), "heldout": len(test_ex),
                     **{s: sum(e.source == s for e in examples) for s in
                        ("sample", "reference", "corrupt")}},
        "sample_positive_rate": positive_rate([e for e in examples if e.source == "sample"]),
        "train_positive_rate": positive_rate(train_ex),
        "final_loss": fitted["final_loss"],
        "model_flops": training.model + sampling.model,
        "executed_flops": training.executed + sampling.executed,
        "tokens": training.tokens + sampling.tokens,
        "flops": {"training": _phase(training), "sampling": _phase(sampling)},
        "wall_s": round(time.perf_counter() - t0, 3),
        "spec": asdict(spec),
    }
    record = _finite(record)  # a metric without both classes is nan: null in JSON
    (out / "prm.json").write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    return record


def _finite(value):
    """JSON-safe copy: nan (a metric without both classes) becomes null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value
