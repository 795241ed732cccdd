"""The Qwen2.5-Math-PRM model card's conversation, as text: what the PRM reads around a prompt
and its steps (no torch: the step bound's planner counts its tokens too)."""

from __future__ import annotations

from race.feedback.kind import QWEN_SYSTEM_PROMPT


def conversation(tokenizer, prompt: str, body: str) -> str:
    """The model card's conversation: its system prompt, ``prompt`` as the user turn and
    ``body`` (the steps, each closed by the separator) as the assistant turn."""
    messages = [{"role": "system", "content": QWEN_SYSTEM_PROMPT},
                {"role": "user", "content": prompt},
                {"role": "assistant", "content": body}]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)


def template_tokens(tokenizer) -> int:
    """The tokens the conversation adds around a prompt and its steps."""
    return len(tokenizer(conversation(tokenizer, "", ""), add_special_tokens=False)["input_ids"])
