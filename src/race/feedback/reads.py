"""What a feedback model reads of a policy's row, priced before it is read: the budget stop's
reserve for the reward phase (:class:`race.flops.meter.RewardReads`). The trainer, ``race
check-config``, ``race plan`` and the memory estimate all price a reward model's reads here.

A row of ``P`` prompt and ``C`` completion policy tokens is at most
``p·P + c·C + appended + template`` of the feedback model's tokens:

* ``c`` (completion): the most model tokens one policy token can cost *after the step
  formatting* (:func:`race.data.task.split_steps`: lines stripped, blank lines dropped, each
  line closed by the separator). Each vocabulary piece is split at its newlines; a part next
  to a newline loses that side's whitespace, an outer side may or may not sit at a line's edge
  (both are priced, the larger kept); the piece is charged one separator per line that can
  end inside it (a run of newlines, however long, ends at most one line). Completions are
  adversarial -- the policy may emit any token -- so every piece is priced.
* ``p`` (prompt): 1 when both tokenizers cut text alike (same normalizer, pre-tokenizer and
  BPE model: a prompt, tokenized canonically by the policy, is the same tokens to the model);
  otherwise the most model tokens of one policy piece as it is.
* ``appended``: the separator closing the last line; ``template``: the chat template's own
  tokens (a Qwen-Math PRM's conversation).

It assumes the model's tokenizer never cuts a concatenation into more tokens than its pieces
(checked on adversarial completions of the real Qwen vocabulary by the tests). Without the
tokenizers at hand (a hub id not yet downloaded), :func:`planned_reads` states the planning
rule: the same reads when both sides are ladder models (one character tokenizer), an estimate
of 2 model tokens per policy token otherwise.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

from race.data.task import STEP_SEPARATOR
from race.feedback.kind import HEAD, SEPARATOR, model_kind, num_labels
from race.flops.analytic import Arch, resolve_arch
from race.flops.meter import RewardReads

#: The planning rule's model tokens per policy token when the tokenizers cannot be read.
PLANNED_EXPANSION = 2


@dataclass(frozen=True)
class Expansion:
    """Model tokens per policy token: of the prompt (as it is) and of the completion (after
    the step formatting, its separators included)."""

    prompt: int
    completion: int


def _pieces(tokenizer) -> dict[str, tuple[str, int]]:
    """Every non-special token of ``tokenizer`` decoded alone, as its text -> (the text its
    whole characters make, its bytes of cut characters). A byte-level piece may cut a
    character (its text alone holds U+FFFD): the character is decoded whole from several
    pieces, and a byte-level model reads it in at most one token per byte, so each piece is
    charged its own bytes of it."""
    special = set(tokenizer.all_special_ids)
    backend = tokenizer.backend_tokenizer
    out: dict[str, tuple[str, int]] = {}
    for i in range(len(tokenizer)):
        text = "" if i in special else backend.decode([i])
        if text:
            whole, cut = (text, 0) if "\ufffd" not in text else _whole(backend.id_to_token(i))
            if cut >= out.get(text, ("", 0))[1]:
                out[text] = (whole, cut)
    return out


@functools.cache
def _byte_decoder() -> dict[str, int]:
    """Byte-level BPE's surface character -> byte."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    return {c: b for b, c in bytes_to_unicode().items()}


def _whole(token: str) -> tuple[str, int]:
    """(whole characters, bytes of cut ones) of a byte-level token's surface form; a token of
    another kind is charged every byte of its text."""
    decoder = _byte_decoder()
    if not all(c in decoder for c in token):
        return "", len(token.encode())
    raw = bytes(decoder[c] for c in token)
    whole = raw.decode("utf-8", errors="ignore")
    return whole, len(raw) - len(whole.encode())


def _count(tokenizer, texts: list[str]) -> dict[str, int]:
    """Tokens of each distinct text, no special tokens added."""
    texts = sorted(set(t for t in texts if t))
    encoded = tokenizer.backend_tokenizer.encode_batch_fast(texts, add_special_tokens=False)
    return {t: len(e.ids) for t, e in zip(texts, encoded, strict=True)} | {"": 0}


def line_parts(piece: str) -> tuple[list[tuple[str, ...]], int]:
    """How a policy piece can appear in the step text: per part between its newlines, the
    texts it may become, and how many lines can end inside the piece (module docstring)."""
    if STEP_SEPARATOR not in piece:
        return [(piece, piece.lstrip(), piece.rstrip(), piece.strip())], 0
    parts = piece.split(STEP_SEPARATOR)
    first, *middle, last = parts
    variants = [(first.rstrip(), first.strip()), *((m.strip(),) for m in middle),
                (last.lstrip(), last.strip())]
    return variants, 1 + sum(1 for m in middle if m.strip())


def _cuts_alike(a: str, b: str) -> bool:
    """Whether two fast tokenizers (their ``tokenizer.json`` text) cut ordinary text into the
    same tokens."""
    keys = ("normalizer", "pre_tokenizer", "model")
    parsed = [json.loads(t) for t in (a, b)]
    return all(parsed[0].get(k) == parsed[1].get(k) for k in keys)


def expansion(policy_tokenizer, model_tokenizer, separator: str | None) -> Expansion:
    """The prompt and completion expansions of ``model_tokenizer`` reading rows of
    ``policy_tokenizer`` whose steps are closed by ``separator`` (None: the raw text, an ORM).
    Measured once per pair of tokenizers and this module's rule: the result is kept in the
    user's cache (``$XDG_CACHE_HOME/race/reads``, keyed by both tokenizers, the separator and
    this file), since the measurement reads the whole vocabulary (seconds on Qwen's)."""
    import hashlib
    import os

    from race.core.atomic import write_json_atomic

    files = [t.backend_tokenizer.to_str() for t in (policy_tokenizer, model_tokenizer)]
    key = hashlib.sha256(Path(__file__).read_bytes())
    for part in (*files, str(separator)):
        key.update(part.encode() + b"\0")
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "race" / \
        "reads" / f"{key.hexdigest()}.json"
    try:
        return Expansion(**json.loads(cache.read_text()))
    except (OSError, ValueError, TypeError):
        pass
    measured = _measure(policy_tokenizer, model_tokenizer, separator, _cuts_alike(*files))
    try:
        write_json_atomic(cache, {"prompt": measured.prompt, "completion": measured.completion})
    except OSError:
        pass  # a read-only home: measured again next time
    return measured


def _measure(policy_tokenizer, model_tokenizer, separator: str | None,
             cuts_alike: bool) -> Expansion:
    """:func:`expansion`, measured over the policy's vocabulary (module docstring)."""
    pieces = _pieces(policy_tokenizer)
    shapes = {p: line_parts(whole) for p, (whole, _) in pieces.items()} \
        if separator is not None else {}
    texts = [*(w for w, _ in pieces.values()),
             *(v for parts, _ in shapes.values() for options in parts for v in options)]
    counts = _count(model_tokenizer, texts)
    plain = max([1] + [counts[whole] + cut for whole, cut in pieces.values()])
    prompt = 1 if cuts_alike else plain
    if separator is None:
        return Expansion(prompt, plain)
    completion = max([1] + [sum(max(counts[v] for v in options) for options in parts) + ends
                            + pieces[p][1] for p, (parts, ends) in shapes.items()])
    return Expansion(prompt, completion)


def measured_reads(arch: Arch, head: str, num_labels: int, *, policy_tokenizer,
                   model_tokenizer, separator: str | None, template: int = 0) -> RewardReads:
    """The reads of a model whose tokenizer is at hand (module docstring); without a policy
    tokenizer the model reads the policy's own tokens (expansion 1)."""
    e = Expansion(1, 1) if policy_tokenizer is None else \
        expansion(policy_tokenizer, model_tokenizer, separator)
    return RewardReads(arch, head, num_labels, prompt_expansion=e.prompt,
                       expansion=e.completion, appended=0 if separator is None else 1,
                       template=template)


def planned_reads(arch: Arch, head: str, *, shared: bool) -> RewardReads:
    """The planning rule, for tokenizers not at hand (module docstring): ``shared`` when the
    policy and the model read the same character tokenizer."""
    e = 1 if shared else PLANNED_EXPANSION
    return RewardReads(arch, head, prompt_expansion=e, expansion=e,
                       appended=1 if head != "sequence" else 0)


@functools.cache
def folder_reads(policy_dir: str, model_dir: str,
                 chat_template: bool | None = None) -> RewardReads:
    """:func:`measured_reads` of the model in ``model_dir`` reading rows of the policy in
    ``policy_dir``, from their files (tokenizers, config.json), as the trainer's loaded model
    measures them; ``chat_template`` as the rewards entry sets it (None: a Qwen-Math PRM uses
    its tokenizer's template when it has one)."""
    from race.data.tokenizer import load_tokenizer

    kind = model_kind(model_dir)
    model_tokenizer = load_tokenizer(model_dir)
    template = 0
    has_template = bool(getattr(model_tokenizer, "chat_template", None))
    if kind == "qwen_math" and (has_template if chat_template is None else chat_template):
        from race.feedback.conversation import template_tokens

        template = template_tokens(model_tokenizer)
    labels = num_labels(model_dir) if kind == "orm" else 2  # a PRM scores two labels
    return measured_reads(resolve_arch(Path(model_dir)), HEAD[kind], labels,
                          policy_tokenizer=load_tokenizer(policy_dir),
                          model_tokenizer=model_tokenizer, separator=SEPARATOR[kind],
                          template=template)
