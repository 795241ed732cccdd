"""Learned feedback models (PRMs, an ORM option): the shared scoring loop and its FLOP ledger.

Three kinds of feedback model load through :func:`race.feedback.loading.load_feedback_model`,
and all answer ``step_scores(prompts, completions) -> list[list[float]]``,
``score(..., aggregate)``, ``consume() -> PhaseFlops`` and ``reads`` (what it reads of a
completion, the budget stop's price of it):

``TokenClassifierPRM``  ours (``race prm``): a ``Qwen2ForTokenClassification`` with 2 labels.
    Text = prompt + each completion line closed by ``"\\n"``
    (:func:`race.feedback.prm_data.prm_text`);
    a step's score is the softmax probability of label 1 ("correct") at the ``"\\n"`` that
    closes its line.
``QwenMathPRM``  the Qwen2.5-Math-PRM convention: transformers' ``Qwen2Model`` + ``score =
    Linear(h, h) -> ReLU -> Linear(h, 2)``; each step is closed by the token ``<extra_0>``
    instead of a newline; score = softmax probability of label 1 at each ``<extra_0>``. The
    official repository needs remote code, which RACE never runs:
    :class:`race.feedback.qwen_math.QwenMathPRMModule` rebuilds it and loads the checkpoint's
    safetensors (``model.*``, ``score.0.*``, ``score.2.*``; an ``lm_head.*`` is ignored). With
    a tokenizer that has a chat template the text is the model card's conversation (system
    prompt, the prompt as the user turn, the steps as the assistant turn);
    ``chat_template: false`` turns that off.
``OutcomeRewardModel``  an ORM: ``Qwen2ForSequenceClassification`` over prompt + completion
    (raw text); score = sigmoid of the logit with 1 label, softmax probability of label 1
    with 2 labels. Its ``step_scores`` is one "step" per completion, so every aggregate is
    that score.

Scores are probabilities in [0, 1]. Aggregation (:func:`race.feedback.scores.aggregate`):
``min`` (the weakest step), ``last`` (the last line: the answer line of a well-formed
completion), ``product``, ``mean`` (partial credit).

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

FLOPs (``race.flops.analytic`` conventions; charged to the ``reward`` phase in training and to
``eval``
in best-of-n; :meth:`FeedbackModel.consume` returns and resets them):

* model FLOPs: per scored row, the backbone forward over its real tokens with causal attention
  plus the score head at every real position (transformers' heads run at every position:
  ``Linear(d, labels)`` 2·d·labels, the Qwen-Math MLP 2·d² + 4·d per position);
* executed FLOPs: every row of a batch at the padded width with the full attention block, head
  at every position (padding included), as the kernels ran it. Executed >= model; without
  padding the difference is exactly the masked upper triangle of the attention block;
* tokens: real tokens the feedback model read.

``reads`` (:class:`race.flops.meter.RewardReads`, the budget stop's price of a row): at most
``p·P + c·C + s + t`` of its tokens for P prompt and C completion policy tokens, measured by
:mod:`race.feedback.reads` from the step formatting over the policy's vocabulary (``s`` the
separator appended to the last line, ``t`` the chat template's own tokens).

The Qwen-Math PRM is :mod:`race.feedback.qwen_math`; loading by name, path or hub id is
:mod:`race.feedback.loading`; the rewards built on these models are :mod:`race.feedback.rewards`;
PRM training is :mod:`race.feedback.prm_training`.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from contextlib import contextmanager
from pathlib import Path

import torch

from race.core.schema import check
from race.core.specs import DEVICES
from race.data.task import STEP_SEPARATOR, split_steps
from race.feedback import scores
from race.feedback.prm_data import (
    PROBE_TEXT,
    prm_text,
    step_positions,
)
from race.feedback.reads import measured_reads
from race.feedback.scores import AGGREGATES, as_text
from race.flops import analytic as flops
from race.flops.meter import PhaseFlops, RewardReads
from race.policy.device import resolve_device as policy_device

#: A policy vocabulary up to this size is probed whole at load (a character tokenizer); a
#: larger one (a BPE vocabulary) only through the task probe and the per-call check.
PROBE_VOCAB_LIMIT = 4096


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


def resolve_device(device: str | None) -> str:
    """A feedback model's device: None or a ``device`` key value (auto, cpu, cuda; see
    :mod:`race.policy.device`), or any torch device string (``cuda:1``) as it is."""
    if device is None or device in DEVICES:
        return policy_device(device)
    return device


def resolve_dtype(dtype: str | None, device: str):
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
        check("rewards", "batch_size", batch_size)
        self.name, self.batch_size = name, batch_size
        self.pad_id = self.tokenizer.pad_token_id
        if self.pad_id is None:  # pads are masked out: any id works for a PRM
            self.pad_id = self.tokenizer.eos_token_id or 0
        self.sep_id = self._separator_id()
        self.arch = flops.Arch.from_config(self.model.config)
        self.ledger = _Ledger(self.arch, self.head, num_labels, attn_implementation)
        self.template_tokens = template_tokens
        self.tokenize(probe_text(policy_tokenizer))  # fail at load, not mid-training
        self.policy_tokenizer = policy_tokenizer

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

    # ------------------------------------------------------------------ scoring
    def _format(self, prompt: str, completion: str) -> tuple[str, int]:
        return prm_text(prompt, completion, self.separator)

    def _encode(self, prompt: str, completion: str) -> tuple[list[int], list[int]] | None:
        """(ids, score positions) of one row, or None when the completion has no step."""
        text, n = self._format(prompt, as_text(completion))
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
        return [scores.aggregate(s, aggregate) for s in self.step_scores(prompts, completions)]

    def consume(self) -> PhaseFlops:
        """FLOPs and tokens of the forwards since the last call (then reset to zero)."""
        return self.ledger.consume()

    @functools.cached_property
    def reads(self) -> RewardReads:
        """What this model reads of a row, at most (race.feedback.reads): measured once, on
        first use, over the policy's vocabulary (a second or so on Qwen's)."""
        return measured_reads(self.ledger.arch, self.ledger.head, self.ledger.num_labels,
                              policy_tokenizer=self.policy_tokenizer,
                              model_tokenizer=self.tokenizer, separator=self.separator,
                              template=self.template_tokens)


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
def quiet_transformers():
    """transformers' warnings off inside the block (expected load-report entries)."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)


def check_loaded(name: str, info: dict) -> None:
    missing = info.get("missing_keys") or []
    if missing:
        raise ValueError(f"feedback model {name}: checkpoint lacks weights {sorted(missing)[:5]}")


def _load_classifier(model_class, path: str | Path, name: str, attn_implementation: str,
                     device: str, dtype: str | None):
    """A safetensors classifier checkpoint (no remote code), every weight present."""
    model, info = model_class.from_pretrained(
        str(path), use_safetensors=True, attn_implementation=attn_implementation,
        dtype=resolve_dtype(dtype, device), output_loading_info=True)
    check_loaded(name, info)
    return model


class TokenClassifierPRM(FeedbackModel):
    """Our PRM: ``Qwen2ForTokenClassification`` (2 labels), steps closed by ``"\\n"``."""

    def __init__(self, path: str | Path, *, name: str | None = None, batch_size: int = 64,
                 attn_implementation: str = "sdpa", device: str | None = None,
                 dtype: str | None = None, policy_tokenizer=None):
        from transformers import Qwen2ForTokenClassification

        from race.data.tokenizer import load_tokenizer

        name = name or str(path)
        device = resolve_device(device)
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

        from race.data.tokenizer import load_tokenizer

        name = name or str(path)
        device = resolve_device(device)
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
        text, n = self._format(prompt, as_text(completion))
        if n == 0:
            return None
        return self.tokenize(text), [0]

    def _positive(self, logits):  # pooled: (rows, labels) -> (rows, 1)
        probs = logits.sigmoid() if logits.shape[-1] == 1 else logits.softmax(-1)[:, 1:]
        return probs
