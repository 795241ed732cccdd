"""The Qwen2.5-Math-PRM convention rebuilt without remote code (see race.feedback.models)."""

from __future__ import annotations

from pathlib import Path

import torch

from race.core.atomic import saving_weights
from race.data.task import split_steps
from race.feedback.conversation import conversation, template_tokens
from race.feedback.kind import QWEN_STEP_TOKEN
from race.feedback.models import (
    FeedbackModel,
    check_loaded,
    quiet_transformers,
    resolve_device,
    resolve_dtype,
)
from race.feedback.prm_data import prm_text

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
        with quiet_transformers():  # its load report lists the score.* keys loaded below
            backbone, info = Qwen2Model.from_pretrained(
                str(path), use_safetensors=True, attn_implementation=attn_implementation,
                dtype=dtype, output_loading_info=True)
        check_loaded(name, info)
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
        with saving_weights(out, f"PRM {out}"):
            save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})


class QwenMathPRM(FeedbackModel):
    """A PRM in the Qwen2.5-Math-PRM convention (module docstring)."""

    head = "prm_mlp"
    separator = QWEN_STEP_TOKEN

    def __init__(self, path: str | Path, *, name: str | None = None, batch_size: int = 16,
                 attn_implementation: str = "sdpa", device: str | None = None,
                 dtype: str | None = None, policy_tokenizer=None,
                 chat_template: bool | None = None):
        from race.data.tokenizer import load_tokenizer

        name = name or str(path)
        device = resolve_device(device)
        self.tokenizer = load_tokenizer(path)
        if QWEN_STEP_TOKEN not in self.tokenizer.get_vocab():  # before loading 7B of weights
            raise ValueError(f"PRM {name}: its tokenizer has no step separator token "
                             f"{QWEN_STEP_TOKEN!r}")
        has_template = bool(getattr(self.tokenizer, "chat_template", None))
        if chat_template and not has_template:
            raise ValueError(f"PRM {name}: chat_template requested but its tokenizer has none")
        self.chat = has_template if chat_template is None else chat_template
        module = QwenMathPRMModule.from_pretrained(
            path, attn_implementation=attn_implementation, dtype=resolve_dtype(dtype, device),
            name=name)
        self.model = module.to(device).eval()
        template = template_tokens(self.tokenizer) if self.chat else 0
        self._setup(name, num_labels=2, attn_implementation=attn_implementation,
                    batch_size=batch_size, policy_tokenizer=policy_tokenizer,
                    template_tokens=template)

    def _format(self, prompt: str, completion: str) -> tuple[str, int]:
        if not self.chat:
            return prm_text(prompt, completion, QWEN_STEP_TOKEN)
        lines = split_steps(completion)
        body = "".join(ln + QWEN_STEP_TOKEN for ln in lines)
        return conversation(self.tokenizer, prompt, body), len(lines)
