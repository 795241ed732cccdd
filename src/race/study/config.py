"""The study config: the one reader, validation, and the checks the schema cannot express.

:func:`load_study` reads YAML (rejecting duplicate keys, which plain YAML silently overwrites;
reading ``1e18`` as a number, as YAML 1.2 does and YAML 1.1 does not), fixes the numbers a YAML
1.1 reader left as strings and checks the FLOP-valued keys (:func:`coerce_numbers`, which the
Snakefile runs too, on the config Snakemake read), validates it against the package's
``config.schema.yaml`` (filling defaults; the schema owns every type, range, enum and
default), types it into a :class:`race.core.study.Study`, then runs the rules between keys
(:func:`check_study`, one function per group of rules). Every error is a :class:`ConfigError`
whose message starts with the offending key, raised before anything is written under
``results/``. The grid and its paths are the Study's; the jobs built from a study and a cell
are :mod:`race.study.builders`.
"""

from __future__ import annotations

import copy
import json
import math
import re
import unicodedata
from pathlib import Path

import yaml

from race.core.cells import (
    cell_key,
    fits_wildcard,
    format_budget,
    is_hub_id,
    is_ladder,
    only_dots,
    slug,
)
from race.core.errors import ConfigError
from race.core.ladder import LADDER_DIALS
from race.core.schema import SCHEMA, properties, schema
from race.core.specs import REWARD_KEYS, REWARD_MODEL_KEY, SEARCH_TARGETS
from race.core.study import Study

# --------------------------------------------------------------------------- loading


#: A YAML 1.2 float that YAML 1.1 (PyYAML, and Snakemake's ``--configfile`` reader) reads as
#: a string: scientific notation without a dot or without a sign in the exponent, as people
#: write FLOP counts (``1e18``, ``2E10``, ``1.5e9``, ``-3e4``, ``1e-4``). YAML 1.1 reads only
#: ``1.0e+18``.
SCIENTIFIC = re.compile(r"^[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)[eE][-+]?[0-9]+$")
#: Config keys (dotted; a list by its name) holding model FLOPs: each value must be a positive
#: number (the schema's ``budgets`` description: "in model FLOPs").
FLOP_KEYS = ("budgets", "race.pilot_rungs", "race.validation_budget")


class _UniqueKeyLoader(yaml.SafeLoader):
    """Safe YAML without duplicate keys, reading :data:`SCIENTIFIC` as floats (YAML 1.2)."""


def _construct_mapping(loader, node, deep=False):
    seen = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise ConfigError(f"duplicate key {key!r} (line {key_node.start_mark.line + 1}): "
                              "names must be unique")
        seen.add(key)
    return yaml.SafeLoader.construct_mapping(loader, node, deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
                                 _construct_mapping)
# Tried after YAML 1.1's own resolvers (so 1.0e+18 and 12 keep their 1.1 meaning); the subclass
# gets its own copy of the resolver table (yaml.SafeLoader is left as is).
_UniqueKeyLoader.add_implicit_resolver("tag:yaml.org,2002:float", SCIENTIFIC,
                                       list("-+0123456789."))


def _schema_node(node: dict | None, root: dict) -> dict:
    while node and "$ref" in node:  # "#/$defs/name"
        target = root
        for part in node["$ref"].lstrip("#/").split("/"):
            target = target[part]
        node = target
    return node or {}


def _types(node: dict) -> set[str]:
    kind = node.get("type", ())
    return {kind} if isinstance(kind, str) else set(kind)


def _coerce(value, node: dict, root: dict):
    """``value`` with the numbers of a YAML 1.1 reader fixed where the schema wants one."""
    node = _schema_node(node, root)
    if isinstance(value, dict):
        extra = node.get("additionalProperties")
        for key, item in value.items():
            sub = node.get("properties", {}).get(key, extra if isinstance(extra, dict) else None)
            value[key] = _coerce(item, sub, root)
        return value
    if isinstance(value, list):
        value[:] = [_coerce(item, node.get("items"), root) for item in value]
        return value
    types = _types(node)
    if "string" in types or not types & {"number", "integer"}:
        return value
    if isinstance(value, str) and SCIENTIFIC.match(value.strip()):
        value = float(value.strip())
    if "integer" in types and isinstance(value, float) and value.is_integer():
        return int(value)  # 1e3 steps: an int, as the code that counts them expects
    return value


def _flops_text(value) -> str:
    return f"{value:.6g}" if isinstance(value, int | float) and not isinstance(value, bool) \
        else repr(value)


def coerce_numbers(config: dict) -> dict:
    """Numbers as a researcher writes them, on a config read by any YAML loader (in place;
    returned): the one step before schema validation, both in :func:`load_study` and in the
    Snakefile (whose ``config`` Snakemake read with YAML 1.1).

    Where the schema wants a number, a string in :data:`SCIENTIFIC` form (``2e10``: what YAML
    1.1 leaves a string) becomes a float; where it wants an integer, an integral float becomes
    an int (``steps: 1e3``). Strings where the schema wants a string are left alone (a quoted
    ``study: "1e3"`` stays a name). Then every FLOP-valued key (:data:`FLOP_KEYS`) must hold
    positive finite numbers: anything else is a :class:`ConfigError` naming the key, e.g.
    ``budgets[1]: 'abc' is not a positive number of FLOPs``."""
    root = schema()
    _coerce(config, root, root)
    for dotted in FLOP_KEYS:
        section, _, key = dotted.rpartition(".")
        holder = config.get(section) if section else config
        if not isinstance(holder, dict) or holder.get(key) is None:
            continue
        value = holder[key]
        items = enumerate(value) if isinstance(value, list) else [(None, value)]
        for i, v in items:
            if isinstance(v, bool) or not isinstance(v, int | float) or not 0 < v < math.inf:
                where = dotted if i is None else f"{dotted}[{i}]"
                raise ConfigError(f"{where}: {_flops_text(v)} is not a positive number of FLOPs "
                                  "(model FLOPs, e.g. 1e18 or 2.5e10)")
    return config


def read_yaml(path: str | Path) -> dict:
    """A config file as written (numbers not yet coerced); every error names the file."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"{path}: config file not found")
    try:
        data = yaml.load(path.read_text(), Loader=_UniqueKeyLoader)  # noqa: S506 (safe loader)
    except ConfigError as exc:  # a duplicate key: say in which file
        raise ConfigError(f"{path}: {exc}") from None
    except yaml.MarkedYAMLError as exc:  # a syntax error: where it is, not a parser traceback
        mark = exc.problem_mark
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        raise ConfigError(f"{path}: not valid YAML{where}: {exc.problem or exc.context}") from None
    except (yaml.YAMLError, OSError, UnicodeDecodeError) as exc:  # not text, or not a file
        raise ConfigError(f"{path}: not a readable YAML file ({exc})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the config must be a mapping")
    return data


def check_as_written(config: dict) -> None:
    """The checks that must see the config as written, before the schema fills in defaults:
    ``eval.train_temperature`` is not written (the workflow sets it per cell); a ``rewards:``
    entry holds only keys its type reads (:data:`race.core.specs.REWARD_KEYS`;
    the schema's defaults put ``aggregate``, ``weight`` and ``verifier`` into every entry, so
    afterwards a ``weight`` on a prm reward, which nothing reads, could not be told from its
    default). A value equal to its default is not a setting and passes, so a resolved config
    (every default filled in) checks as valid. Keys the schema does not know are left to its
    own error. Every number is finite and every name and other text is clean
    (:func:`_check_values`)."""
    _check_values(config)
    evaluation = config.get("eval")
    if isinstance(evaluation, dict) and _set(evaluation, "train_temperature",
                                             properties("eval")):
        raise ConfigError("eval.train_temperature: not a setting: each cell is evaluated at its "
                          "own training temperature (training.temperature, or its "
                          "allocation's), which the workflow passes; remove the key")
    known = properties("rewards")
    rewards = config.get("rewards")
    for name, entry in (rewards.items() if isinstance(rewards, dict) else ()):
        kind = entry.get("type") if isinstance(entry, dict) else None
        if kind not in REWARD_KEYS:
            continue
        for key in entry:
            if key in known and key != "type" and key not in REWARD_KEYS[kind] and _set(
                    entry, key, known):
                raise ConfigError(f"rewards.{name}.{key}: type {kind} reads no {key} key (it "
                                  f"reads {', '.join(REWARD_KEYS[kind])})")


def _check_values(value, key: str = "") -> None:
    """NaN and infinity are refused wherever a number is written (no key means either: a NaN
    learning rate would cost every finished cell its files before the first step failed),
    and so are a control character or surrounding whitespace in any text, a mapping's keys
    (reward and allocation names) included (``study: "s\\n"`` matches the schema's pattern,
    whose ``$`` admits a final newline). Each refusal names the key."""
    if isinstance(value, dict):
        for name, item in value.items():
            where = f"{key}.{name}" if key else str(name)
            _check_values(name, f"{where} (the name)")
            _check_values(item, where)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _check_values(item, f"{key}[{i}]")
    elif isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{key}: {value} is not a finite number")
    elif isinstance(value, str):
        if any(unicodedata.category(ch) == "Cc" for ch in value):
            raise ConfigError(f"{key}: {value!r} holds a control character (a newline, a tab)")
        if value != value.strip():
            raise ConfigError(f"{key}: {value!r} starts or ends with whitespace")


def _set(section: dict, key: str, props: dict) -> bool:
    """Whether ``key`` is written in ``section`` with a value other than the schema's default
    (a resolved config -- the one logged to MLflow, the benches' -- holds every default, and
    a default changes nothing)."""
    return key in section and ("default" not in props[key]
                               or section[key] != props[key]["default"])


def validate_schema(config: dict) -> dict:
    """Schema validation with defaults filled in (the same call the Snakefile makes)."""
    from snakemake.exceptions import WorkflowError
    from snakemake.utils import validate

    config = copy.deepcopy(config)
    try:
        validate(config, str(SCHEMA), set_default=True)
    except WorkflowError as exc:
        raise ConfigError(_schema_message(exc)) from None
    return config


def _schema_message(exc) -> str:
    """jsonschema's first line, led by the key it is about as the config names it
    (``On instance['eval']['targets'][0]`` -> ``eval.targets[0]: ...``)."""
    text = str(exc)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    where = next((ln for ln in lines if ln.startswith("On instance")), "")
    head = next((ln for ln in lines if "Error validating config" not in ln), text)
    head = head.removeprefix("ValidationError: ").removesuffix(where).strip()
    parts = re.findall(r"\['([^']*)'\]|\[(\d+)\]", where)
    key = "".join(f"[{index}]" if index else f".{name}" for name, index in parts).lstrip(".")
    return f"{key}: {head}" if key else f"config schema: {head}"


def load_study(path: str | Path) -> Study:
    """The study of a YAML file: read, checked against the schema with its defaults filled
    in, typed, then the cross-field checks (:func:`check_study`); or -- when ``path`` is
    inline JSON (starts with ``{``) -- the config slice a workflow rule passes to its
    command, already checked when the Snakefile was parsed (typed as it is)."""
    text = str(path).lstrip()
    if text.startswith("{"):
        return typed_study(json.loads(text))
    config = coerce_numbers(read_yaml(path))
    check_as_written(config)
    return check_study(typed_study(validate_schema(config)))


def load_config(path: str | Path) -> dict:
    """The resolved config mapping of :func:`load_study` (every default filled in)."""
    return dict(load_study(path).config)


def typed_study(config: dict) -> Study:
    """:meth:`Study.from_config`, its errors (a rule between the keys of one section, such
    as the task's step ranges) as :class:`ConfigError` s naming the key."""
    try:
        return Study.from_config(config)
    except (TypeError, ValueError) as exc:
        raise ConfigError(str(exc)) from None


def is_model_spec(spec: str) -> bool:
    """A ladder name, an existing local directory, a known architecture or a hub id."""
    from race.flops.known_configs import is_known

    return (is_ladder(spec) or Path(spec).is_dir() or is_known(spec)
            or is_hub_id(spec))


# --------------------------------------------------------------------------- cross-field checks


def _unique(items, key: str) -> None:
    seen = set()
    for i, item in enumerate(items):
        if item in seen:
            raise ConfigError(f"{key}[{i}]: duplicate entry {item!r}")
        seen.add(item)


def first_step_bound(study: Study, size: str, alloc_name: str, reward_name: str,
                     max_prompt: int) -> int | None:
    """The model FLOPs the trainer reserves before a cell's first step
    (:func:`race.flops.meter.generation_step_bound`: prompts of ``max_prompt`` tokens, full
    completions, the reward model priced by :func:`race.study.plan.reward_reads`), or None
    when the policy's architecture is not known offline."""
    from race.data.tokenizer import VOCAB_SIZE
    from race.flops import analytic as flops
    from race.flops.meter import StepMeter, generation_step_bound
    from race.study.plan import spec_reads

    try:
        arch = flops.resolve_arch(size, vocab=VOCAB_SIZE if is_ladder(size) else None)
    except (ValueError, FileNotFoundError, KeyError):
        return None
    alloc = study.allocations[alloc_name]
    meter = StepMeter(arch, alloc.lora, beta=alloc.beta, num_iterations=alloc.num_iterations,
                      grad_ckpt=study.training.gradient_checkpointing)
    reward = study.rewards[reward_name]
    reads = spec_reads(size, reward, study.revisions)
    return generation_step_bound(meter, alloc.rows, max_prompt, alloc.max_completion_length,
                                 reads)


def _check_first_rung(study: Study) -> None:
    """Every cell's first rung must afford one step (:func:`first_step_bound`)."""
    max_prompt = study.max_prompt_tokens()
    if max_prompt is None:
        return  # prompt lengths are known only once the data is built; race train checks
    first = study.budgets[0]
    for size in study.sizes:
        for alloc_name in study.allocations:
            for reward_name in study.rewards:
                bound = first_step_bound(study, size, alloc_name, reward_name, max_prompt)
                if bound is not None and bound > first:
                    raise ConfigError(
                        f"budgets[0]: {first:.3g} FLOPs is below one step of cell "
                        f"{cell_key(size, reward_name, alloc_name, 0)} (up to {bound:.3g} "
                        "model FLOPs): raise the first rung or shrink that allocation")


def _check_run_length(study: Study) -> None:
    """No cell's run needs more steps to reach a rung than ``max_steps_per_run`` (unset:
    race.study.plan.MAX_STEPS_PER_RUN), counted as race plan counts them (the fewest steps
    the rung buys in that cell); the refusal names the first such rung and the cell with the
    cheapest step. Unchecked, like the first rung, while the prompt lengths are unknown."""
    from race.study.plan import cell_step_cost, first_overlong

    max_prompt = study.max_prompt_tokens()
    if max_prompt is None:
        return  # race train checks the job against its built data
    runs = {}
    for size in study.sizes:
        for alloc_name in study.allocations:
            for reward_name in study.rewards:
                cost = cell_step_cost(study, size, alloc_name, reward_name, max_prompt)
                if cost is not None:
                    runs[f"size~{slug(size)}/reward~{reward_name}/alloc~{alloc_name}"] = cost
    over = first_overlong(runs, study.budgets, study.max_steps_per_run) if runs else None
    if over is not None:
        raise ConfigError(over.message("budgets"))


def _check_memory(study: Study) -> None:
    """With ``gpu_memory_gb`` stated, every training and evaluation job's peak estimate
    (race.study.memory) fits in it."""
    if study.gpu_memory_gb is None:
        return
    from race.study.memory import GIB, study_memory

    limit = study.gpu_memory_gb * GIB
    for name, estimate in study_memory(study).items():
        if estimate.total > limit:
            phase = estimate.peak_phase
            fix = ("lower training.micro_batch_rows, or turn on "
                   "training.gradient_checkpointing" if phase == "learning" else
                   "fewer rows per step (prompts_per_step x num_generations) or a shorter "
                   "completion cap" if phase == "rollout" else
                   "a smaller eval.batch_size" if phase == "generation" else
                   "a smaller feedback model, or its batch_size")
            raise ConfigError(
                f"gpu_memory_gb: job {name} needs about {estimate.total / GIB:.1f} GiB at its "
                f"peak ({phase}: {estimate.summary()}), more than the {study.gpu_memory_gb:g} "
                f"GiB stated: {fix}")


def _check_rewards(study: Study) -> None:
    """A reward's name fits a path, and one that needs a model names one that exists (a
    trained ladder PRM, a folder or a hub id); which keys it may hold is
    :func:`check_as_written`'s."""
    for name, reward in study.rewards.items():
        if not fits_wildcard("reward", name):
            raise ConfigError(f"rewards.{name}: names may use letters, digits and _ . + -")
        _not_dots("rewards", name)
        wanted = REWARD_MODEL_KEY[reward.type]
        if wanted is None:
            continue
        model = reward.model
        if not model:
            raise ConfigError(f"rewards.{name}.{wanted}: the {reward.type} reward needs a "
                              f"{'PRM' if wanted == 'prm' else 'model path or hub id'}")
        if wanted == "prm" and model in study.prm_sizes:
            continue
        if not (Path(model).is_dir() or is_hub_id(model)):
            ladder = f"one of prm.sizes {list(study.prm_sizes)}, " if wanted == "prm" else ""
            raise ConfigError(f"rewards.{name}.{wanted}: {model!r} is not {ladder}an existing "
                              "folder or a hub id (org/name)")


def _check_task(study: Study) -> None:
    """A task kind that reads files or a hub id names them."""
    needs = {"jsonl": ("train_jsonl", "eval_in_jsonl", "eval_ood_jsonl"), "hf": ("hf_id",)}
    for key in needs.get(study.source.kind, ()):
        if not getattr(study.source, key):
            raise ConfigError(f"task.{key}: required when task.kind is {study.source.kind}")


def _check_ladder_prms(study: Study) -> None:
    """A PRM trained here (a ladder name in ``prm.sizes``) learns automatic step labels of the
    arithmetic task on completions the ladder's base policies sample, and ``prm.init: base``
    starts it from the base policy of its own size: each needs what it is built from."""
    ladder = [s for s in study.sizes if is_ladder(s)]
    kind = study.source.kind
    for i, size in enumerate(study.prm_sizes):
        if not is_ladder(size):
            continue
        if kind != "arithmetic":
            raise ConfigError(f"prm.sizes[{i}]: a ladder PRM learns automatic step labels of "
                              f"the arithmetic task, and task.kind {kind!r} has no steps to "
                              "label; name a trained PRM by path or hub id")
        if not ladder:
            raise ConfigError(f"prm.sizes[{i}]: a ladder PRM is trained on completions of the "
                              "ladder's base policies, and sizes names none")
        if study.prm.init == "base" and size not in ladder:
            raise ConfigError(f"prm.init: base starts PRM {size!r} from the base policy of its "
                              f"size, which sizes does not train; use init: auto or random")


def _check_sizes(study: Study) -> None:
    """Policy and PRM sizes are unique, known, and name a path the workflow can use."""
    _unique(study.sizes, "sizes")
    _unique(study.prm_sizes, "prm.sizes")
    for key, specs in (("sizes", study.sizes), ("prm.sizes", study.prm_sizes)):
        for i, spec in enumerate(specs):
            if not is_model_spec(spec):
                raise ConfigError(f"{key}[{i}]: unknown {'PRM ' * (key != 'sizes')}size "
                                  f"{spec!r} (a ladder name {sorted(LADDER_DIALS)}, a local "
                                  "directory or a hub id)")
            if not fits_wildcard("size", slug(spec)):
                raise ConfigError(f"{key}[{i}]: {spec!r} names a path the workflow cannot "
                                  "put in a file name: use letters, digits, / and _ . + - "
                                  "(a symlink to it will do)")


def _check_allocation_names(study: Study) -> None:
    for name in study.allocations:
        if not fits_wildcard("alloc", name):
            raise ConfigError(f"allocations.{name}: names may use letters, digits and _ . -")
        _not_dots("allocations", name)


def _not_dots(key: str, name: str) -> None:
    """A name that becomes part of a path or an MLflow name is not only dots (``..`` reads as
    the parent folder wherever the name stands alone; the schema's pattern lets it through)."""
    if only_dots(name):
        raise ConfigError(f"{key}: the name {name!r} is only dots, which a path reads as this "
                          "or the parent folder: use a name with a letter or digit")


def _check_budgets(study: Study) -> None:
    """Rungs strictly increase, and each has a folder name that reads back as itself."""
    budgets = study.budgets
    for i in range(1, len(budgets)):
        if budgets[i] <= budgets[i - 1]:
            raise ConfigError(f"budgets[{i}]: rungs must be strictly increasing "
                              f"({budgets[i - 1]:.3g} then {budgets[i]:.3g})")
    names = [format_budget(b) for b in budgets]
    for i, (budget, name) in enumerate(zip(budgets, names, strict=True)):
        # A rung's folder is named budget~<7 significant digits>: two budgets must not share
        # one, and the name must read back as the budget the trainer stops at.
        if float(name) != float(budget) or names.index(name) != i:
            raise ConfigError(f"budgets[{i}]: {budget!r} would be written to budget~{name}, "
                              "which is not exactly it or is another rung's folder: use at most "
                              "7 significant digits")
    _unique(study.seeds, "seeds")


def _check_teacher(study: Study) -> None:
    if study.teacher.noisy and study.source.kind != "arithmetic" \
            and any(is_ladder(s) for s in study.sizes):
        raise ConfigError("teacher.noisy: the noisy teacher corrupts arithmetic chains and "
                          f"task.kind {study.source.kind!r} has none; set teacher.noisy: "
                          "false")


def _check_revisions(study: Study) -> None:
    """``revisions:`` pins only hub ids the config loads (a typo would otherwise leave the
    id it meant unpinned, silently)."""
    from race.core.references import is_hub_reference

    source = study.source
    named = [*study.sizes, *study.prm_sizes, *(r.model for r in study.rewards.values()),
             study.eval.prm, *((source.hf_id, source.hf_ood_id) if source.kind == "hf" else ())]
    hub = sorted({s for s in named if is_hub_reference(s)})
    for key in study.revisions:
        if key not in hub:
            why = ("a local folder, covered by its files" if Path(key).is_dir() else
                   "not a hub id the config loads" if is_hub_id(key) else "not a hub id")
            raise ConfigError(f"revisions.{key}: {why}; pin one of the hub ids of sizes, "
                              "prm.sizes, rewards, eval.prm, task.hf_id and task.hf_ood_id "
                              f"({', '.join(hub) or 'the config names none'})")


def _check_eval(study: Study) -> None:
    """An hf task has its own OOD split for ood_pass1; a named best-of-n PRM exists."""
    if (study.source.kind == "hf" and not study.source.hf_ood_id
            and "ood_pass1" in study.eval_targets):
        # Without its own id, eval_ood is hf_id's test split again: the records of eval_in,
        # which ood_pass1 would report as out-of-distribution accuracy.
        raise ConfigError("task.hf_ood_id: required when eval.targets includes ood_pass1 and "
                          "task.kind is hf (eval_ood would be hf_id's test split: eval_in)")
    bon_prm = study.eval.prm
    if bon_prm is not None and bon_prm not in study.prm_sizes and (
            is_ladder(bon_prm) or not is_model_spec(bon_prm)):
        raise ConfigError(f"eval.prm: {bon_prm!r} is not one of prm.sizes (a ladder PRM is "
                          "trained here only when prm.sizes names it)")


def _check_race(study: Study) -> None:
    """The pilot's rungs are budgets, its baseline an allocation, and each target it ranks
    is evaluated and has a value at the pilot rungs."""
    race, budgets = study.race, study.budgets
    for i, rung in enumerate(race.pilot_rungs or ()):
        if float(rung) not in budgets:
            raise ConfigError(f"race.pilot_rungs[{i}]: {rung:.3g} is not one of budgets")
    if race.validation_budget is not None and float(race.validation_budget) not in budgets:
        raise ConfigError("race.validation_budget: must be one of budgets")
    if race.baseline is not None and race.baseline not in study.allocations:
        raise ConfigError(f"race.baseline: {race.baseline!r} is not an allocation")
    evaluated = study.eval_targets
    for i, target in enumerate(race.targets or ()):
        if target not in evaluated:
            raise ConfigError(f"race.targets[{i}]: {target!r} is not evaluated (eval.targets: "
                              f"{', '.join(evaluated)})")
        if target in SEARCH_TARGETS and study.search_only_at_top:
            raise ConfigError(f"race.targets[{i}]: {target} runs only at the top rung with "
                              "eval.search_at: base_and_top, so the pilot rungs have none")
        if target == "prm_bon" and study.eval_prm is None:
            raise ConfigError(f"race.targets[{i}]: prm_bon needs a PRM to rerank with "
                              "(eval.prm or prm.sizes), and the study has none")
    if race.enabled and not study.race_targets:
        raise ConfigError("race.targets: the pilot has no target to rank: every evaluated "
                          f"target ({', '.join(evaluated) or 'none'}) has no value at the pilot "
                          "rungs; name one in race.targets or add one to eval.targets")
    _unique(race.validation_seeds, "race.validation_seeds")


def check_study(study: Study) -> Study:
    """The rules between keys, which the schema (types, ranges, enums: checked before this)
    cannot express, each written once; returns the study unchanged."""
    from race.study.inputs import InputError, check_inputs

    _not_dots("study", study.name)
    _check_task(study)
    _check_sizes(study)
    _check_rewards(study)
    _check_allocation_names(study)
    _check_budgets(study)
    _check_teacher(study)
    _check_eval(study)
    _check_revisions(study)
    _check_race(study)
    _check_first_rung(study)
    _check_run_length(study)
    _check_memory(study)
    try:
        check_inputs(study)
    except InputError as exc:
        raise ConfigError(str(exc)) from None
    _check_ladder_prms(study)
    return study
