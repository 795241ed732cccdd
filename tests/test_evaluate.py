"""Evaluation (issue #6): metric logic, selection rules, the real generation path on a tiny
saved policy (with and without a LoRA adapter), eval FLOPs against FlopCounterMode,
determinism, the eval.json schema, and the CLI with MLflow."""

import json
import math
import random
from dataclasses import astuple, replace
from pathlib import Path

import pytest

from race.core.jobs import EvalJob, to_json
from race.core.jobs import Snapshot as EvalSnapshot
from race.core.specs import TARGETS, EvalSpec, TaskSpec
from race.data.task import Record, write_splits
from race.evaluation.eval_job import evaluate
from race.evaluation.metrics import best_index, bootstrap_interval, majority_index, wilson
from race.evaluation.snapshot import Snapshot, load_snapshot
from race.evaluation.targets import Evaluator, SamplePool, batch_flops, rebatched_flops, verifier
from race.flops import analytic as flops
from race.flops.meter import PhaseFlops

#: Small enough that every evaluate call on a nano policy takes well under a second.
SMALL = EvalSpec(n_in=10, n_ood=6, max_new_tokens=10, max_new_tokens_ood=14, sample_prompts=4,
                 k=3, bon_n=4, native_prompts=4, native_samples=2, batch_size=8,
                 bootstrap_reps=200, sampled_prompts=5, sampled_k=3)
LORA_TARGETS = ["q_proj", "v_proj", "down_proj"]


class FakePRM:
    """The race.feedback.models scorer interface: score(prompts, completions, aggregate) +
    consume().

    Scores come from ``fn(prompt, completion)`` (default: the completion's length) or, when
    ``fixed`` is given, from that list in call order. Charges 7 FLOPs per completion character
    so that the scoring ledger is visibly the scorer's own.
    """

    name = "fake-prm"

    def __init__(self, fn=None, fixed=None):
        self.fn = fn or (lambda p, c: float(len(c)))
        self.fixed = fixed
        self.calls = []
        self.pending = PhaseFlops(0, 0, 0)

    def score(self, prompts, completions, aggregate="min"):
        self.calls.append((list(prompts), list(completions), aggregate))
        chars = sum(len(c) for c in completions)
        p = self.pending
        self.pending = PhaseFlops(p.model + 7 * chars, p.executed + 9 * chars, p.tokens + chars)
        if self.fixed is not None:
            return list(self.fixed)
        return [self.fn(p, c) for p, c in zip(prompts, completions, strict=True)]

    def consume(self):
        out, self.pending = self.pending, PhaseFlops(0, 0, 0)
        return out


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def root(tmp_path_factory, tokenizer):
    """Data splits, a random-init nano policy, and a budget rung with a (random) LoRA adapter."""
    from peft import LoraConfig, get_peft_model

    from race.policy.ladder import build_ladder_model

    root = tmp_path_factory.mktemp("evaluate")
    write_splits(TaskSpec(n_train=40, n_eval_in=12, n_eval_ood=8), root / "data")
    build_ladder_model("nano", tokenizer, seed=0).save_pretrained(root / "base")
    tokenizer.save_pretrained(root / "base")
    # init_lora_weights=False: random A and B, so the adapter really changes the policy.
    adapted = get_peft_model(build_ladder_model("nano", tokenizer, seed=0),
                             LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                                        target_modules=LORA_TARGETS, init_lora_weights=False))
    run = root / "runs" / "size~nano" / "reward~rule" / "alloc~a" / "seed~0"
    rung = run / "budget~1e+09"
    adapted.save_pretrained(rung)
    (rung / "ledger.json").write_text(json.dumps({"step": 7, "budget": 1e9,
                                                  "model_flops": 123}))
    return root


def _strip_wall(obj):
    if isinstance(obj, dict):
        return {k: _strip_wall(v) for k, v in obj.items() if k != "wall_s"}
    return obj


# --------------------------------------------------------------------------- metric logic


@pytest.mark.parametrize("k, lo, hi", [(0, 0.0, 0.27753279986288926),
                                       (5, 0.236593090512564, 0.7634069094874361),
                                       (10, 0.7224672001371109, 1.0)])
def test_wilson_known_values(k, lo, hi):
    # Reference values: scipy.stats.binomtest(k, 10).proportion_ci(method="wilson").
    got = wilson(k, 10)
    assert got[0] == pytest.approx(lo, abs=1e-12) and got[1] == pytest.approx(hi, abs=1e-12)
    assert (got[0] == 0.0) == (k == 0) and (got[1] == 1.0) == (k == 10)


def test_wilson_rejects_bad_counts():
    with pytest.raises(ValueError):
        wilson(0, 0)
    with pytest.raises(ValueError):
        wilson(11, 10)


def test_majority_ties_and_unparseable():
    assert majority_index([5, 7, 7]) == 1  # plain majority: the first sample of the winner
    assert majority_index([7, 5, 5, 7]) == 0  # 2-2 tie: 7 was sampled first
    assert majority_index([2, 3, 3, 2, 1]) == 0
    assert majority_index([None, 4, None, 6]) == 1  # unparseable answers never vote
    assert majority_index([None, None, 3]) == 2
    assert majority_index([None, None]) is None and majority_index([]) is None


def test_best_of_n_ties_and_nan():
    assert best_index([0.1, 0.9, 0.9]) == 1  # tie: the earliest sample
    assert best_index([0.5, 0.5]) == 0
    assert best_index([float("nan"), 0.2]) == 1  # a NaN score never wins over a number
    assert best_index([float("nan")] * 3) == 0
    with pytest.raises(ValueError):
        best_index([])


def test_bootstrap_interval():
    assert bootstrap_interval([[0.5, 0.5], [0.5, 0.5]], reps=50) == (0.5, 0.5)
    groups = [[1.0, 0.0], [1.0, 1.0], [0.0, 0.0], [1.0, 0.0], [0.0, 1.0]]
    lo, hi = bootstrap_interval(groups, reps=500, seed=3)
    assert 0.0 <= lo < 0.5 < hi <= 1.0
    assert bootstrap_interval(groups, reps=500, seed=3) == (lo, hi)  # seeded
    # Against a hand-written cluster bootstrap (groups resampled, mean of all values): the
    # percentile bounds agree within Monte-Carlo error.
    rng = random.Random(0)
    unequal = [[1.0], [0.0, 0.0, 1.0], [1.0, 1.0], [0.0], [1.0, 0.0, 0.0, 0.0]] * 4
    reps = []
    for _ in range(4000):
        drawn = [unequal[rng.randrange(len(unequal))] for _ in unequal]
        reps.append(sum(map(sum, drawn)) / sum(map(len, drawn)))
    reps.sort()
    got = bootstrap_interval(unequal, reps=4000, seed=0)
    assert got == pytest.approx((reps[100], reps[3899]), abs=0.02)
    assert bootstrap_interval([[1.0, 0.0, 1.0]]) == (2 / 3, 2 / 3)  # one cluster: no spread


def test_eval_spec_from_config():
    assert EvalSpec.from_config(None) == EvalSpec()
    assert EvalSpec.from_config({"targets": None}).targets == TARGETS
    spec = EvalSpec.from_config({"targets": ["maj_k"], "k": 4, "prm": "micro"})
    assert spec.targets == ("maj_k",) and spec.k == 4 and spec.prm == "micro"
    with pytest.raises(ValueError, match="eval.kk"):
        EvalSpec.from_config({"kk": 4})
    with pytest.raises(ValueError, match="eval.targets"):
        EvalSpec(targets=("pass_at_2",))
    with pytest.raises(ValueError, match="eval.k"):
        EvalSpec(k=0)


# --------------------------------------------------------------------------- selection


def _fixed_pool():
    """Three prompts x four hand-written samples (no model involved)."""
    records = [Record("a\n", "5"), Record("b\n", "7"), Record("c\n", "3")]
    texts = [["#### 7", "#### 5", "#### 5", "#### 7"],
             ["garbage", "#### 7", "#### 8", "x"],
             ["#### 3", "#### 4", "#### 4", "nonsense"]]
    rows = [[(3, 4 + i + j) for j in range(4)] for i in range(3)]
    return SamplePool(records, 4, texts, rows, batches=[], wall_s=0.0)


def _fixed_evaluator(spec, prm=None):
    snap = Snapshot(None, None, flops.resolve_arch("nano"), None, "p", None, False)
    return Evaluator(snap, [], [], spec, prm=prm)


def test_maj_k_selection_on_fixed_samples():
    pool = _fixed_pool()
    # k=4: 7-vs-5 tie -> 7 (sampled first, wrong); 7 beats 8 (right); 4 beats 3 (wrong).
    assert _fixed_evaluator(replace(SMALL, k=4)).maj_k(pool).correct == 1
    # k=2: [7, 5] tie -> 7 (wrong); [None, 7] -> 7 (right); [3, 4] tie -> 3 (right).
    result = _fixed_evaluator(replace(SMALL, k=2)).maj_k(pool)
    assert (result.correct, result.n, result.samples) == (2, 3, 6)
    assert result.acc == pytest.approx(2 / 3) and (result.lo, result.hi) == wilson(2, 3)
    # Only a prefix of the pool is used: charged as its own 6 rows generated alone.
    model = sum(flops.generate_flops(flops.resolve_arch("nano"), p, g)
                for group in pool.rows for p, g in group[:2])
    assert result.generation.model == model and result.generation.tokens == sum(
        g for group in pool.rows for _, g in group[:2])


def test_prm_best_of_n_selection_on_fixed_samples():
    # Per prompt: argmax is "#### 7" (wrong); a 0.7-0.7 tie between "#### 7" (right) and "x";
    # a 0.6-0.6 tie between "#### 3" (right) and "#### 4". Earliest-wins gives 2/3; a
    # latest-wins tie rule would give 0/3.
    scores = [0.1, 0.2, 0.1, 0.95, 0.1, 0.7, 0.2, 0.7, 0.6, 0.6, 0.1, 0.0]
    prm = FakePRM(fixed=scores)
    result = _fixed_evaluator(replace(SMALL, bon_n=4, prm_aggregate="last"), prm).prm_bon(
        _fixed_pool())
    assert (result.correct, result.n, result.samples) == (2, 3, 12)
    prompts, completions, aggregate = prm.calls[0]
    assert len(prm.calls) == 1 and aggregate == "last"  # one batched call for all samples
    assert prompts == ["a\n"] * 4 + ["b\n"] * 4 + ["c\n"] * 4
    chars = sum(len(c) for c in completions)
    assert result.scoring == PhaseFlops(7 * chars, 9 * chars, chars)
    assert result.flops.model == result.generation.model + 7 * chars


# --------------------------------------------------------------------------- real path


def test_snapshot_with_adapter(root):
    import torch

    ids = torch.tensor([[5, 6, 7, 8, 9]])
    base = load_snapshot(root / "base")
    rung = next((root / "runs").rglob("budget~*"))
    merged = load_snapshot(root / "base", rung, merge=True)
    unmerged = load_snapshot(root / "base", rung, merge=False)
    with torch.no_grad():
        logits = [s.model(input_ids=ids).logits for s in (base, merged, unmerged)]
    assert not torch.allclose(logits[0], logits[1], atol=1e-3)  # the adapter changes the policy
    assert torch.allclose(logits[1], logits[2], atol=1e-4)  # merging does not
    assert base.lora is None and merged.lora is None and merged.merged
    assert unmerged.lora == flops.LoraSpec(4, tuple(sorted(LORA_TARGETS)))


def _count(evaluator, fn):
    from race.flops.counter import count_flops

    with count_flops() as fc:
        result = fn(evaluator)
    return result, fc.total


@pytest.mark.parametrize("merge, attn", [(True, "eager"), (False, "eager"), (True, "sdpa"),
                                         (False, "sdpa")])
def test_eval_flops_match_flop_counter(root, merge, attn):
    """Greedy in_pass1 and the sampled pool of sampled_pass1, merged adapters or not, eager or
    SDPA attention: the ledger's executed FLOPs are exactly what torch ran."""
    from race.data.task import load_jsonl

    spec = replace(SMALL, attn_implementation=attn, merge_adapter=merge)
    rung = next((root / "runs").rglob("budget~*"))
    snap = load_snapshot(root / "base", rung, merge=merge, attn_implementation=attn)
    evaluator = Evaluator(snap, load_jsonl(root / "data" / "eval_in.jsonl"), [], spec)
    sampled, sampled_measured = _count(evaluator, lambda e: e.sampled_pass1())
    assert sampled.samples == spec.sampled_prompts * spec.sampled_k
    assert sampled.flops.executed == sampled_measured
    result, measured = _count(evaluator, lambda e: e.pass1(e.eval_in[:spec.n_in],
                                                           spec.max_new_tokens))
    assert result.n == 10 and result.samples == 10
    assert result.flops.executed == measured
    assert result.flops.model < result.flops.executed
    assert evaluator.executed_total == PhaseFlops(
        *(a + b for a, b in zip(astuple(sampled.flops), astuple(result.flops), strict=True)))
    if not merge:  # the unmerged adapters' FLOPs are charged (~3% here): without them the
        # same greedy generation would be estimated more than 1% low
        plain = Evaluator(replace(snap, lora=None), evaluator.eval_in, [], spec)
        without = plain.pass1(plain.eval_in[:spec.n_in], spec.max_new_tokens)
        assert without.flops.tokens == result.flops.tokens
        assert measured - without.flops.executed > 0.01 * measured


def test_evaluate_schema_and_sharing(root, tmp_path):
    out = tmp_path / "rung" / "eval.json"
    prm = FakePRM()
    payload = evaluate(root / "base", root / "data", out, SMALL, reward={"type": "rule"},
                       prm=prm)
    assert json.loads(out.read_text()) == payload
    assert [p.name for p in out.parent.iterdir()] == ["eval.json"]  # no temp file left behind
    assert payload["format"] == "race-eval/1" and payload["phase"] == "eval"
    assert payload["rung"] == {"step": 0, "budget": None, "train_model_flops": 0}
    assert list(payload["targets"]) == list(TARGETS)
    expected_n = {"in_pass1": 10, "sampled_pass1": 5, "ood_pass1": 6, "maj_k": 4, "prm_bon": 4,
                  "native_reward": 4}
    expected_samples = {"in_pass1": 10, "sampled_pass1": 15, "ood_pass1": 6, "maj_k": 12,
                        "prm_bon": 16, "native_reward": 8}
    for target, r in payload["targets"].items():
        assert r["skipped"] is None
        assert r["n"] == expected_n[target] and r["samples"] == expected_samples[target]
        assert 0.0 <= r["lo"] <= r["acc"] <= r["hi"] <= 1.0
        assert r["interval"] == ("bootstrap" if target in ("native_reward", "sampled_pass1")
                                 else "wilson")
        f = r["flops"]
        assert all(isinstance(f[k], int) for k in ("model", "executed", "tokens"))
        assert 0 < f["model"] <= f["executed"] and f["tokens"] > 0
        parts = r["flops_parts"]
        assert f["model"] == parts["generation"]["model"] + parts["scoring"]["model"]
    # One shared pool of max(k, bon_n) = 4 samples: best-of-4 uses all of it, maj@3 a prefix.
    assert len(prm.calls) == 1 and len(prm.calls[0][1]) == 16
    bon, maj = payload["targets"]["prm_bon"], payload["targets"]["maj_k"]
    assert bon["details"]["pool_samples_per_prompt"] == 4
    assert bon["flops_parts"]["scoring"]["model"] == 7 * sum(len(c) for c in prm.calls[0][1])
    assert maj["flops"]["model"] < bon["flops_parts"]["generation"]["model"]
    charged, ran = payload["charged_total"], payload["executed_total"]
    assert charged["model"] == sum(r["flops"]["model"] for r in payload["targets"].values())
    # native_reward (4 prompts x 2) is the head of sampled_pass1's pool (5 x 3): each pool ran
    # once, while every target is charged its own samples.
    native = payload["targets"]["native_reward"]
    assert 0 < native["flops"]["model"] < payload["targets"]["sampled_pass1"]["flops"]["model"]
    assert ran["model"] == charged["model"] - maj["flops"]["model"] - native["flops"]["model"]
    # Without sharing every target's ledger is what it ran.
    alone = evaluate(root / "base", root / "data", None, replace(SMALL, share_samples=False),
                     reward={"type": "rule"}, prm=FakePRM())
    assert alone["charged_total"] == alone["executed_total"]


def test_native_reward_scores_the_head_of_the_sampled_pool(root):
    """With sharing, native_reward's completions are sampled_pass1's first native_samples of its
    first native_prompts prompts, charged as if generated alone; without it, a pool of its own."""
    from race.data.task import load_jsonl
    from race.feedback.rewards import build_reward

    snap = load_snapshot(root / "base")
    records = load_jsonl(root / "data" / "eval_in.jsonl")
    spec = replace(SMALL, targets=("sampled_pass1", "native_reward"))
    seen = []

    def reward(prompts, completions, answer, **_):
        seen.append(list(completions))
        return build_reward({"type": "rule"})(prompts=prompts, completions=completions,
                                              answer=answer)

    shared = Evaluator(snap, records, [], spec, reward=reward)
    result = shared.run()["native_reward"]
    pool = shared._sampled_pool
    assert seen[0] == [t for texts in pool.texts[:4] for t in texts[:2]]
    assert result.generation == rebatched_flops(snap.arch, pool.prefix_rows(2, 4),
                                                spec.batch_size)
    assert shared.executed_total == batch_flops(snap.arch, pool.batches)  # one pool ran
    alone = Evaluator(snap, records, [], replace(spec, share_samples=False), reward=reward)
    alone.run()
    assert alone.executed_total.model > shared.executed_total.model  # a second pool ran


def test_sampled_pass1_is_mean_at_k_with_its_diagnostics(root):
    """mean@k over prompts x k samples at the training temperature; pass@k, the format-valid
    share and the failure shares come from the same samples."""
    from race.data.task import FAILURES, failure_kind, load_jsonl, problem_of

    snap = load_snapshot(root / "base")
    records = load_jsonl(root / "data" / "eval_in.jsonl")
    spec = replace(SMALL, targets=("sampled_pass1",), train_temperature=0.7)
    evaluator = Evaluator(snap, records, [], spec)
    result = evaluator.run()["sampled_pass1"]
    # The same draw again, by hand: the salt makes it independent of the other targets.
    pool = Evaluator(snap, records, [], spec).sample_pool(
        records[:5], 3, max_new_tokens=spec.max_new_tokens, temperature=0.7, salt=6)
    kinds = [[failure_kind(problem_of(r), t) for t in texts]
             for r, texts in zip(records[:5], pool.texts, strict=True)]
    correct = sum(k.count("correct") for k in kinds)
    assert result.correct == correct and result.acc == pytest.approx(correct / 15)
    assert result.details["pass@3"] == pytest.approx(
        sum("correct" in k for k in kinds) / 5)
    assert result.details["temperature"] == 0.7 and result.details["samples_per_prompt"] == 3
    assert result.details["correct_per_prompt"] == [k.count("correct") for k in kinds]
    flat = [k for group in kinds for k in group]
    assert result.details["failures"] == {f: flat.count(f) / 15 for f in FAILURES}
    assert result.details["format_valid"] == pytest.approx(1 - flat.count("format") / 15)
    assert result.lo <= result.acc <= result.hi


def test_pool_rebatching_model_flops(root):
    from race.data.task import load_jsonl

    snap = load_snapshot(root / "base")
    evaluator = Evaluator(snap, load_jsonl(root / "data" / "eval_in.jsonl"), [], SMALL)
    pool = evaluator.sample_pool(evaluator.eval_in[:5], 3, max_new_tokens=8, temperature=1.0,
                                 salt=1)
    real = batch_flops(snap.arch, pool.batches)
    again = rebatched_flops(snap.arch, pool.prefix_rows(3), SMALL.batch_size)
    assert again == real  # rebatched as generate batched them: executed FLOPs too
    assert again.executed >= again.model


def test_generate_batches_by_prompt_length_and_answers_in_order(root):
    """Rows run sorted by prompt length (each batch's prompts no longer than the next batch's),
    texts and rows come back in the caller's order, and a prompt's greedy completion does not
    depend on which prompts share its batch."""
    from race.data.task import load_jsonl
    from race.policy.generation import generate

    snap = load_snapshot(root / "base")
    prompts = [r.prompt for r in load_jsonl(root / "data" / "eval_in.jsonl")[:10]]
    lengths = [len(snap.tokenizer(p, add_special_tokens=False)["input_ids"]) for p in prompts]
    assert len(set(lengths)) > 1  # the test needs prompts of several lengths
    gens = generate(snap.model, snap.tokenizer, prompts, engine="fused", max_new_tokens=10,
                    batch_size=3, num_return_sequences=2)
    assert [p for p, _ in gens.rows] == [n for n in lengths for _ in range(2)]
    ran = [p for b in gens.batches for p in b.prompt_lens]
    assert ran == sorted(ran)
    assert sorted(gens.rows) == sorted(r for b in gens.batches
                                       for r in zip(b.prompt_lens, b.completion_lens, strict=True))
    for i, prompt in enumerate(prompts):
        alone = generate(snap.model, snap.tokenizer, [prompt], engine="fused",
                         max_new_tokens=10)
        assert gens.texts[2 * i] == gens.texts[2 * i + 1] == alone.texts[0]


def test_missing_prm_and_reward_are_skipped(root):
    payload = evaluate(root / "base", root / "data", None, SMALL)
    for target in ("prm_bon", "native_reward"):
        r = payload["targets"][target]
        assert r["acc"] is None and r["lo"] is None and r["n"] == 0
        assert "no " in r["skipped"] and r["flops"] == {"model": 0, "executed": 0, "tokens": 0}
    assert payload["settings"]["prm"] is None


def test_empty_split_is_skipped(root):
    snap = load_snapshot(root / "base")
    results = Evaluator(snap, [], [], replace(SMALL, targets=("ood_pass1", "maj_k"))).run()
    assert all(r.skipped and r.acc is None for r in results.values())


def test_math_verifier_votes_on_numbers():
    is_correct, key = verifier("math")
    texts = ["so 1,000", "#### 1000.0", "it is 7", "#### 7"]
    assert [key(t) for t in texts] == [1000.0, 1000.0, 7.0, 7.0]
    pick = majority_index([key(t) for t in texts])  # 2-2 tie: 1000 was sampled first
    assert pick == 0 and is_correct(texts[pick], "1000")


def test_evaluate_is_deterministic(root):
    rung = next((root / "runs").rglob("budget~*"))
    runs = [evaluate(root / "base", root / "data", None, SMALL, adapter=rung,
                     reward={"type": "rule"}, prm=FakePRM()) for _ in range(2)]
    assert _strip_wall(runs[0]) == _strip_wall(runs[1])
    assert runs[0]["rung"]["step"] == 7 and runs[0]["adapter_merged"]
    other_seed = evaluate(root / "base", root / "data", None, replace(SMALL, seed=1),
                          adapter=rung, reward={"type": "rule"}, prm=FakePRM())
    assert (other_seed["targets"]["maj_k"]["flops"]
            != runs[0]["targets"]["maj_k"]["flops"])  # the seed matters for sampled targets
    assert (_strip_wall(other_seed["targets"]["in_pass1"])
            == _strip_wall(runs[0]["targets"]["in_pass1"]))  # greedy does not


# --------------------------------------------------------------------------- CLI


def _write_random_prm(path: Path, tokenizer) -> Path:
    """A random-init token-classification PRM directory (race.feedback.models's on-disk layout)."""
    from transformers import Qwen2ForTokenClassification

    from race.policy.ladder import ladder_config

    config = ladder_config("nano", len(tokenizer), pad_token_id=tokenizer.pad_token_id)
    config.num_labels = 2
    Qwen2ForTokenClassification(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    (path / "prm.json").write_text(json.dumps({"size": "nano"}))
    return path


def test_cli_with_adapter_prm_and_mlflow(root, tmp_path, tokenizer, monkeypatch):
    pytest.importorskip("race.feedback.models")
    from mlflow.tracking import MlflowClient

    from race.cli import main
    from race.core.specs import MlflowSpec
    from race.tracking.mlflow_runs import RunLogger

    rung = next((root / "runs").rglob("budget~*"))
    run_dir = rung.parent
    ml = {"enabled": True, "tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}",
          "artifact_root": str(tmp_path / "artifacts")}
    spec = MlflowSpec(**ml, experiment="evaltest")
    RunLogger(spec, run_dir, "size~nano/reward~rule/alloc~a/seed~0", "evaltest",
              params={}).finish()  # what training leaves behind: a run and mlflow_run_id
    prm_dir = _write_random_prm(tmp_path / "prm", tokenizer)
    out = rung / "eval.json"
    job = EvalJob(policy=str(root / "base"), data_dir=str(root / "data"),
                  snapshots=[EvalSnapshot(str(rung), str(out))],
                  spec=SMALL.with_overrides(train_temperature=0.7), reward={"type": "rule"},
                  prm=str(prm_dir), mlflow=spec, run_dir=str(run_dir), study="evaltest")
    rc = main(["evaluate", "--job", to_json(job)])
    assert rc == 0
    payload = json.loads(out.read_text())
    assert payload["settings"]["train_temperature"] == 0.7
    assert payload["settings"]["prm"] == str(prm_dir)
    bon = payload["targets"]["prm_bon"]
    assert bon["skipped"] is None and bon["flops_parts"]["scoring"]["model"] > 0
    client = MlflowClient(tracking_uri=ml["tracking_uri"])
    run_id = (run_dir / "mlflow_run_id").read_text().strip()
    for target in TARGETS:
        history = client.get_metric_history(run_id, f"eval/{target}")
        assert [(m.step, m.value) for m in history] == [
            (7, pytest.approx(payload["targets"][target]["acc"]))]
    # The intervals are one table artifact, not eval/<target>_lo / _hi metrics.
    assert not [k for k in client.get_run(run_id).data.metrics if k.endswith(("_lo", "_hi"))]
    # (load_table searches the runs through MLflow's default store, whatever the client's)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", ml["tracking_uri"])
    table = client.load_table(client.get_run(run_id).info.experiment_id, "eval_intervals.json",
                              run_ids=[run_id])
    assert sorted(table["target"]) == sorted(TARGETS) and set(table["step"]) == {7}
    for row in table.itertuples():
        assert math.isclose(row.lo, payload["targets"][row.target]["lo"])
        assert math.isclose(row.hi, payload["targets"][row.target]["hi"])


def test_snapshots_run_their_own_targets(root, tmp_path):
    """eval.search_at: base_and_top: a rung below the top leaves out maj_k and prm_bon."""
    from race.evaluation.eval_job import run_evaluation

    low, top = tmp_path / "low" / "eval.json", tmp_path / "top" / "eval.json"
    job = EvalJob(policy=str(root / "base"), data_dir=str(root / "data"),
                  snapshots=[EvalSnapshot(None, str(low), ["in_pass1", "sampled_pass1"]),
                             EvalSnapshot(None, str(top))],
                  spec=SMALL.with_overrides(targets=("in_pass1", "sampled_pass1", "maj_k")),
                  study="t")
    written = dict(run_evaluation(job))
    assert list(written[str(low)]["targets"]) == ["in_pass1", "sampled_pass1"]
    assert list(written[str(top)]["targets"]) == ["in_pass1", "sampled_pass1", "maj_k"]
    # The same draws either way: a target's samples do not depend on which others run.
    assert (written[str(low)]["targets"]["sampled_pass1"]["acc"]
            == written[str(top)]["targets"]["sampled_pass1"]["acc"])


def test_evaluation_and_prm_sampling_decode_with_the_jobs_engine(root, tmp_path, monkeypatch):
    """A rung's merged-adapter policy and a base policy decode with the job's engine
    (race.core.engines: the training engine unless eval.engine names another): merged and
    static with transformers' generate (static with a static cache), fused with the fused
    decoder; eval.json records the engine. PRM sampling likewise."""
    from transformers import Qwen2ForCausalLM

    from race.evaluation.eval_job import run_evaluation
    from race.feedback.prm_data import sample_completions
    from race.policy.decoder import FusedDecoder

    calls = []
    for cls, name in ((FusedDecoder, "decoder"), (Qwen2ForCausalLM, "generate")):
        def spy(self, *a, _run=cls.generate, _name=name, **k):
            calls.append((_name, k.get("cache_implementation")))
            return _run(self, *a, **k)
        monkeypatch.setattr(cls, "generate", spy)
    rung = next((root / "runs").rglob("budget~*"))
    spec = replace(SMALL, targets=("in_pass1",), n_in=3)
    expected = {"merged": ("generate", None), "static": ("generate", "static"),
                "fused": ("decoder", None)}
    for engine, call in expected.items():
        calls.clear()
        job = EvalJob(policy=str(root / "base"), data_dir=str(root / "data"),
                      snapshots=[EvalSnapshot(str(rung), str(tmp_path / engine / "rung.json")),
                                 EvalSnapshot(None, str(tmp_path / engine / "base.json"))],
                      spec=spec, engine=engine)
        written = dict(run_evaluation(job))
        assert set(calls) == {call}, engine
        assert all(p["settings"]["engine"] == engine for p in written.values())
        assert written[str(tmp_path / engine / "rung.json")]["adapter_merged"]
        calls.clear()
        sample_completions([str(root / "base")], ["12+3=?\n"], per_prompt=2, max_new_tokens=4,
                           temperature=1.0, seed=0, batch_size=2, engine=engine)
        assert set(calls) == {call}, engine


def test_job_loads_a_shared_feedback_model_once(root, tmp_path, tokenizer, monkeypatch):
    """eval.prm and a prm reward on the same PRM, over two snapshots: the job loads the PRM once,
    and every target's value and ledger equal those of the old path (each snapshot evaluated
    alone, prm_bon and native_reward each on a model of its own)."""
    import race.feedback.loading as loading
    from race.core.specs import RewardSpec
    from race.evaluation.eval_job import run_evaluation
    from race.feedback.rewards import build_model_reward

    prm_dir = str(_write_random_prm(tmp_path / "prm", tokenizer))
    rung = next((root / "runs").rglob("budget~*"))
    spec = SMALL.with_overrides(targets=("prm_bon", "native_reward"))
    reward = RewardSpec(type="prm", prm=prm_dir)
    alone = [evaluate(root / "base", root / "data", None, spec, adapter=adapter,
                      prm=loading.load_prm(prm_dir, device="cpu"),
                      reward=build_model_reward({**reward.to_dict(), "device": "cpu"},
                                                tokenizer=tokenizer), device="cpu")
             for adapter in (None, rung)]

    loads = []
    load = loading.load_feedback_model
    monkeypatch.setattr(loading, "load_feedback_model",
                        lambda *a, **kw: loads.append(a[0]) or load(*a, **kw))
    outs = [tmp_path / "base" / "eval.json", tmp_path / "rung" / "eval.json"]
    job = EvalJob(policy=str(root / "base"), data_dir=str(root / "data"),
                  snapshots=[EvalSnapshot(None, str(outs[0])),
                             EvalSnapshot(str(rung), str(outs[1]))],
                  spec=spec, reward=reward, prm=prm_dir, device="cpu", study="t")
    written = dict(run_evaluation(job))
    assert loads == [prm_dir]
    for out, old in zip(outs, alone, strict=True):
        new = json.loads(out.read_text())
        assert new == written[str(out)]
        assert _strip_wall(new["targets"]) == _strip_wall(old["targets"])
        assert new["charged_total"] == old["charged_total"]
        assert new["executed_total"] == old["executed_total"]
        assert all(new["targets"][t]["flops_parts"]["scoring"]["model"] > 0
                   for t in ("prm_bon", "native_reward"))


def test_cli_base_policy(root, tmp_path, capsys):
    from race.cli import main

    out = tmp_path / "base" / "eval.json"
    spec = EvalSpec.from_config({"targets": ["in_pass1", "prm_bon"], "n_in": 4,
                                 "max_new_tokens": 6})
    job = EvalJob(policy=str(root / "base"), data_dir=str(root / "data"),
                  snapshots=[EvalSnapshot(None, str(out))], spec=spec, study="t")
    assert main(["evaluate", "--job", to_json(job)]) == 0
    payload = json.loads(out.read_text())
    assert list(payload["targets"]) == ["in_pass1", "prm_bon"]
    assert payload["targets"]["in_pass1"]["n"] == 4
    assert payload["targets"]["prm_bon"]["skipped"]
    assert "prm_bon: skipped" in capsys.readouterr().out


def test_schema_eval_defaults_match_evalspec():
    """The config schema's eval: defaults are EvalSpec's (the workflow fills them in)."""
    from dataclasses import fields

    from race.core import schema

    props = schema.properties("eval")
    spec = EvalSpec()
    assert set(props) == {f.name for f in fields(EvalSpec)}
    for name, prop in props.items():
        default = getattr(spec, name)
        if name == "targets":  # null in the schema: every target
            assert prop["default"] is None and default == TARGETS
            continue
        if "default" not in prop:  # unset: left out of a study's params (engine)
            assert default is None, name
            continue
        assert prop["default"] == (list(default) if isinstance(default, tuple) else default), name


def test_a_pickle_rung_fails_the_job_before_any_snapshot_is_evaluated(tmp_path, capsys):
    """Every snapshot's adapter is checked before the first is evaluated: a pickle adapter in
    the last rung is a one-line error naming it, and no eval.json is written (Snakemake
    deletes a failed job's outputs: a rung evaluated before the bad one would be lost)."""
    from race.cli import main

    rungs = []
    for budget, weights in (("4e9", "adapter_model.safetensors"), ("8e9", "adapter_model.bin")):
        rung = tmp_path / f"budget~{budget}"
        rung.mkdir()
        (rung / "adapter_config.json").write_text(json.dumps({"r": 4}))
        (rung / weights).write_bytes(b"never loaded")
        rungs.append(rung)
    job = EvalJob(policy=str(tmp_path / "base"), data_dir=str(tmp_path / "data"),
                  snapshots=[EvalSnapshot(str(r), str(r / "eval.json")) for r in rungs],
                  device="cpu")
    assert main(["evaluate", "--job", to_json(job)]) == 2
    assert capsys.readouterr().err == (
        f"race evaluate: adapter: {rungs[1]} holds pickle weights (adapter_model.bin); RACE "
        "loads safetensors only (resave with save_pretrained(..., safe_serialization=True))\n")
    assert not any((r / "eval.json").exists() for r in rungs)
