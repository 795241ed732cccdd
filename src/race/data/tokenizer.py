"""Character-level tokenizer for the offline task, built with ``tokenizers``.

Every character of the alphabet is one token; special tokens ``<pad>``, ``<bos>``, ``<eos>`` and
``<unk>`` come first (ids 0-3). It is wrapped as a ``PreTrainedTokenizerFast``, saved with
``save_pretrained`` and reloaded with ``AutoTokenizer.from_pretrained`` like any hub tokenizer.
The chat template is not used: prompts are plain text and the policy continues them.
"""

from __future__ import annotations

import string
from pathlib import Path

SPECIAL_TOKENS = ["<pad>", "<bos>", "<eos>", "<unk>"]
#: Digits, operators, the answer marker, whitespace and letters (for free-form prompts).
ALPHABET = string.digits + "+-*/=?#.,:()" + " \n" + string.ascii_letters
#: Vocabulary of the default character tokenizer (special tokens + alphabet): the ladder's.
VOCAB_SIZE = len(SPECIAL_TOKENS) + len(dict.fromkeys(ALPHABET))


def build_tokenizer(alphabet: str = ALPHABET):
    """A fast character-level tokenizer; ``decode`` joins characters without spaces."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = list(dict.fromkeys(alphabet))  # dedupe, keep order
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + chars)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    # Isolate every character (newline included) as its own pre-token.
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token="<pad>",
        bos_token="<bos>",
        eos_token="<eos>",
        unk_token="<unk>",
        clean_up_tokenization_spaces=False,
        padding_side="left",  # generation-friendly: every prompt ends at the same position
    )
    return tok


def save_tokenizer(out_dir: str | Path, alphabet: str = ALPHABET) -> Path:
    out_dir = Path(out_dir)
    build_tokenizer(alphabet).save_pretrained(out_dir)
    return out_dir


def load_tokenizer(path: str | Path, revision: str | None = None):
    """Reload any tokenizer directory (ours or a hub model's); a hub id loads at ``revision``,
    else at its pin (:func:`race.core.references.revision_of`), else at the default branch.

    Ours is loaded as the plain fast tokenizer it was saved as: ``AutoTokenizer`` in a model
    directory follows the model's config (``qwen2`` -> ``Qwen2Tokenizer``), whose own
    pre-tokenizer silently drops the newlines that separate steps.
    """
    import json

    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    from race.core.references import revision_of

    revision = revision_of(path, revision) or "main"
    config = Path(path) / "tokenizer_config.json"
    saved_class = json.loads(config.read_text()).get("tokenizer_class") if config.exists() else None
    if saved_class in ("TokenizersBackend", "PreTrainedTokenizerFast"):
        tok = PreTrainedTokenizerFast.from_pretrained(str(path), revision=revision)
    else:
        tok = AutoTokenizer.from_pretrained(str(path), trust_remote_code=False,
                                            revision=revision)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok
