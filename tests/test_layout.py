"""The package's shape: no import cycle, small modules, one command table, every config key
read by some code, nothing that points outside the repository."""

import ast
import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from race.core import jobs, schema, specs
from race.core.specs import TaskSpec, TeacherSpec
from race.core.study import Study

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "race"


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(SRC.parent).with_suffix("").parts).removesuffix(".__init__")


MODULES = {module_name(p): p for p in SRC.rglob("*.py")}
TREES = {name: ast.parse(path.read_text()) for name, path in MODULES.items()}


def imports_of(name: str) -> set[str]:
    """Every race module ``name`` imports, at module level or inside a function (a lazy import
    that closes a cycle is still a cycle)."""
    out = set()
    for node in ast.walk(TREES[name]):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                out.add(full if full in MODULES else node.module)
        elif isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
    return {m for m in out if m in MODULES and m != name}


def test_no_import_cycle():
    graph = {name: imports_of(name) for name in MODULES}
    done: set[str] = set()

    def visit(name: str, path: list[str]) -> None:
        if name in path:
            raise AssertionError("import cycle: " + " -> ".join(path[path.index(name):] + [name]))
        if name in done:
            return
        for dep in sorted(graph[name]):
            visit(dep, path + [name])
        done.add(name)

    for name in sorted(graph):
        visit(name, [])


#: The package's floors, lowest first: a module imports only from its own folder or from a
#: folder below it (lazy imports inside functions included). ``core`` is the vocabulary (no
#: torch, no stage); ``grpo`` and ``evaluation`` share a floor (neither imports the other);
#: ``race`` is the package's own ``__init__`` (it pins the CPU kernels, from ``core``).
FLOORS: tuple[tuple[str, ...], ...] = (
    ("core",), ("race",), ("data",), ("flops",), ("policy",), ("feedback",), ("study",),
    ("tracking",), ("grpo", "evaluation"), ("analysis",), ("cli",))
FLOOR = {folder: level for level, folders in enumerate(FLOORS) for folder in folders}


def folder_of(name: str) -> str:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 and (SRC / parts[1]).is_dir() else "race"


def test_every_folder_has_a_floor():
    assert {folder_of(name) for name in MODULES} == set(FLOOR)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_imports_go_down_the_floors(name):
    """A module imports its own folder or folders below it, so the folders form no cycle."""
    here = folder_of(name)
    upward = sorted(dep for dep in imports_of(name)
                    if folder_of(dep) != here and FLOOR[folder_of(dep)] >= FLOOR[here])
    assert not upward, f"{name} ({here}) imports from its floor or above: {upward}"


def test_core_imports_no_torch_and_no_stage():
    for name, tree in TREES.items():
        if folder_of(name) != "core":
            continue
        for node in ast.walk(tree):
            mods = ([node.module] if isinstance(node, ast.ImportFrom) and node.module else
                    [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            for mod in mods:
                assert mod.split(".")[0] not in ("torch", "transformers", "trl", "peft"), (
                    name, mod)


#: The analytic FLOP model is kept whole (its conventions read best in one place).
LONG_MODULES = {"race.flops.analytic"}


@pytest.mark.parametrize("name", sorted(MODULES))
def test_modules_stay_small(name):
    lines = len(MODULES[name].read_text().splitlines())
    assert name in LONG_MODULES or lines <= 600, f"{name}: {lines} lines"


def test_one_command_table():
    """Every verb module has the three names the entry point calls, and there is one module per
    verb."""
    import importlib

    from race.cli import COMMANDS, build_parser

    for verb, command in COMMANDS.items():
        module = importlib.import_module(command.module)
        assert module.HELP and callable(module.add_arguments) and callable(module.run), verb
    choices = build_parser()._subparsers._group_actions[0].choices
    assert list(choices) == list(COMMANDS)
    cli_files = {p.stem for p in (SRC / "cli").glob("*.py")} - {"__init__", "__main__", "jobs"}
    assert cli_files == {c.module.rsplit(".", 1)[1] for c in COMMANDS.values()}


# --------------------------------------------------------------------------- config keys


def schema_keys() -> list[tuple[str, ...]]:
    """Every key path of the schema: top-level keys, and the keys inside each section (for a
    map of named entries -- allocations, rewards, resources -- the keys of one entry; a map of
    plain values, such as revisions, has none)."""
    keys = []
    for section, node in schema.schema()["properties"].items():
        keys.append((section,))
        if node.get("type") == "object":
            entry = node.get("additionalProperties")
            for key in schema.properties(section) if (
                    "properties" in node or isinstance(entry, dict) and "properties" in entry
            ) else []:
                keys.append((section, key))
    return keys


def _read_strings() -> set[str]:
    """Strings the package and the workflow read a mapping with: ``x["key"]``,
    ``x.get("key")``, ``x.setdefault("key")``, ``x.pop("key")`` and ``res("group", "key")``."""
    found = set()
    for tree in TREES.values():
        for node in ast.walk(tree):
            if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
                found.add(node.slice.value)
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                  and node.func.attr in ("get", "setdefault", "pop") and node.args
                  and isinstance(node.args[0], ast.Constant)):
                found.add(node.args[0].value)
            key = (node.slice if isinstance(node, ast.Subscript) else node.args[0] if (
                isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "get" and node.args) else None)
            if isinstance(key, ast.JoinedStr):
                # x.get(f"{split}_jsonl"): a family of keys, kept as a pattern
                found.add(re.compile("".join(
                    re.escape(v.value) if isinstance(v, ast.Constant) else r"\w+"
                    for v in key.values)))
    for smk in [ROOT / "Snakefile", *(ROOT / "workflow" / "rules").glob("*.smk")]:
        text = smk.read_text()
        found.update(re.findall(r'\["(\w+)"\]', text))
        for group, key in re.findall(r'res\("(\w+)", "(\w+)"\)', text):
            found.update((group, key))
        found.update(re.findall(r'slurm\("(\w+)"\)', text))  # the slurm: section's keys
    return found


SOURCES = "\n".join([*(p.read_text() for p in MODULES.values()),
                     *(p.read_text() for p in (ROOT / "workflow" / "rules").glob("*.smk")),
                     (ROOT / "Snakefile").read_text()])


def _attributes_read() -> set[str]:
    """Attributes the package reads (``x.name``), and those the workflow reads off the study
    (``STUDY.name``)."""
    return {node.attr for tree in TREES.values() for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load)} | set(
        re.findall(r"STUDY\.(\w+)", SOURCES))


#: Typed sections: their keys reach code as fields of these classes.
TYPED = {"eval": (specs.EvalSpec,), "pretrain": (specs.PretrainSpec,), "prm": (specs.PRMSpec,),
         "allocations": (specs.Allocation,),
         "training": (specs.TrainingSpec, specs.Allocation, jobs.TrainJob),
         "mlflow": (specs.MlflowSpec,), "task": (TaskSpec, specs.TaskSource),
         "teacher": (TeacherSpec,), "race": (specs.RaceSpec,), "rewards": (specs.RewardSpec,)}
#: Top-level keys the typed study (race.core.study.Study) holds under another name.
STUDY_FIELDS = {"study": "name", "prm": "prm_sizes", "task": "source"}


#: Keys a section hands on as a group, read through one tuple of names
#: (``{k: spec[k] for k in MODEL_OPTIONS if k in spec}``).
PASSED_ON = {"rewards": specs.MODEL_OPTIONS}


@pytest.mark.parametrize("path", schema_keys(), ids=".".join)
def test_every_config_key_has_a_reader(path):
    """A key is read when code subscripts a mapping with it (or ``.get`` s it), or -- in a
    typed section -- when it is a field of the section's class that code reads as an
    attribute. A key no code reads is a promise the study does not keep."""
    key = path[-1]
    if len(path) == 1:  # a top-level key: a field of the typed study that code reads
        name = STUDY_FIELDS.get(key, key)
        assert name in {f.name for f in dataclasses.fields(Study)}, f"{key}: not in Study"
        assert name in _attributes_read() - {"config"}, f"config key {key}: no code reads it"
        return
    strings = _read_strings()
    if key in strings or any(isinstance(s, re.Pattern) and s.fullmatch(key) for s in strings):
        return
    if key in PASSED_ON.get(path[0], ()):
        return
    classes = TYPED.get(path[0], ())
    if classes and len(path) == 2:
        assert any(key in {f.name for f in dataclasses.fields(c)} for c in classes), (
            f"{'.'.join(path)}: no field of {[c.__name__ for c in classes]}")
        assert key in _attributes_read(), f"{'.'.join(path)}: field never read"
        return
    raise AssertionError(f"config key {'.'.join(path)}: no code reads it")


def test_rules_read_the_resource_names_the_executors_read():
    """threads, mem_mb, runtime and gpu (the SLURM executor plugin reads ``gpu``, not
    ``gpus``) for every model rule."""
    rules = (ROOT / "workflow" / "rules")
    text = "".join(p.read_text() for p in rules.glob("*.smk"))
    assert "gpus=" not in text
    for group in ("base", "prm", "train", "evaluate"):
        for key in ("threads", "mem_mb", "runtime", "gpu"):
            assert f'res("{group}", "{key}")' in text, (group, key)


# --------------------------------------------------------------------------- self-contained


def test_nothing_points_outside_the_repository():
    tracked = [p for p in ROOT.rglob("*") if p.is_file() and p.suffix in (
        ".py", ".md", ".smk", ".yaml", ".rst", ".toml", ".cfg", ".txt") and ".venv" not in p.parts
        and "results" not in p.parts and p.name != Path(__file__).name]
    for path in tracked + [ROOT / "Snakefile", ROOT / "Makefile"]:
        text = path.read_text(errors="ignore")
        assert "../shared" not in text and "DESIGN.md" not in text, path


# --------------------------------------------------------------------------- one step bound


def test_the_step_bound_has_one_definition():
    """The budget stop's rule -- the most a generation step can cost, every row at the longest
    prompt and the completion cap, the reward model included -- is one function, which the
    config check, ``race plan``, the trainer and the tests call; nothing else adds up a
    worst-case step."""
    defined = [name for name, tree in TREES.items() for node in tree.body
               if isinstance(node, ast.FunctionDef) and node.name in (
                   "generation_step_bound", "generation_step", "step_bound")]
    assert defined == ["race.flops.meter", "race.flops.meter"]
    texts = {name: path.read_text() for name, path in MODULES.items()}
    tests = {p.name: p.read_text() for p in (ROOT / "tests").glob("test_*.py")}
    assert {"race.study.config", "race.grpo.run"} <= {
        n for n, t in texts.items() if "generation_step_bound(" in t}
    assert "generation_step(" in texts["race.study.plan"]  # race plan's phases
    assert {"test_train.py", "test_plan.py", "test_config.py"} <= {
        n for n, t in tests.items() if "generation_step_bound(" in t}
    # A worst-case batch is built by the bound itself, by race plan's reuse-step price and by
    # the trainer's data-loader sizing (not a bound): nowhere else.
    builders = {n for n, t in texts.items() if "BatchShapes.worst_case(" in t}
    assert builders == {"race.flops.meter", "race.study.plan", "race.grpo.run"}
    assert not [n for n, t in tests.items() if "worst_case(" in t and "step_bound" in t
                and "generation_step_bound" not in t]


def _enums(node, found: list) -> list:
    """Every ``enum`` of the schema, as a set of its values."""
    if isinstance(node, dict):
        if isinstance(node.get("enum"), list) and len(node["enum"]) > 1:
            found.append(frozenset(node["enum"]))
        for value in node.values():
            _enums(value, found)
    return found


def test_the_schemas_enums_are_not_restated():
    """Every rule on one key -- its type, range and allowed values -- is the schema's, and code
    reads it from there (race.core.schema.check, race.core.specs' lists): no module spells an
    enum of the schema out again, where it could drift."""
    enums = set(_enums(schema.schema(), []))
    restated = []
    for name, tree in TREES.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Tuple | ast.List | ast.Set) and node.elts and all(
                    isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts):
                values = frozenset(e.value for e in node.elts)
                if values in enums:
                    restated.append(f"{name}:{node.lineno} {sorted(values)}")
    assert not restated, restated


#: What a training job never needs at start-up: the analysis and tracking floors, the
#: scheduler, MLflow (TRL imports it whenever installed unless told not to: race.grpo.trainer),
#: plotting, vLLM.
NOT_IN_A_TRAINING_JOB = ("mlflow", "matplotlib", "snakemake", "vllm", "race.analysis",
                         "race.tracking", "race.study", "race.evaluation")


def test_a_training_job_imports_only_what_it_uses():
    """The modules ``race train`` reaches before its first step (its verb, the run, the
    trainer class and TRL's config, the reward, the ladder), imported in a fresh process."""
    code = ("import sys\n"
            "import race.cli.train, race.grpo.run, race.feedback.rewards, race.policy.ladder\n"
            "from race.grpo.trainer import metered_trainer_class\n"
            "metered_trainer_class()\n"
            "from trl import GRPOConfig\n"
            "from peft import LoraConfig\n"
            "from datasets import Dataset\n"
            "print('\\n'.join(sys.modules))\n")
    env = {k: v for k, v in os.environ.items() if k != "DISABLE_MLFLOW_INTEGRATION"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env=env)
    loaded = set(out.stdout.split())
    assert "trl" in loaded and "race.grpo.trainer" in loaded
    unused = sorted(m for m in loaded if m.split(".")[0] in NOT_IN_A_TRAINING_JOB
                    or ".".join(m.split(".")[:2]) in NOT_IN_A_TRAINING_JOB)
    assert not unused, unused
