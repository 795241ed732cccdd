from race.core.specs import TaskSpec
from race.data.task import make_splits
from race.data.tokenizer import SPECIAL_TOKENS, load_tokenizer


def test_round_trip_through_auto_tokenizer(tokenizer):
    for p in make_splits(TaskSpec(n_train=50, n_eval_in=10, n_eval_ood=10))["eval_ood"]:
        text = p.prompt + p.solution
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert len(ids) == len(text)  # one token per character
        assert tokenizer.decode(ids) == text
    eos = tokenizer.eos_token_id
    assert tokenizer.decode([*ids, eos], skip_special_tokens=True) == text


def test_special_tokens_and_padding(tokenizer_dir):
    tok = load_tokenizer(tokenizer_dir)
    assert [tok.pad_token, tok.bos_token, tok.eos_token, tok.unk_token] == SPECIAL_TOKENS[:3] + [
        "<unk>"]
    assert tok.pad_token_id == 0 and tok.padding_side == "left"
    batch = tok(["1+1=?\n", "12+13-4=?\n"], padding=True, add_special_tokens=False)
    assert batch["input_ids"][0][:4] == [0, 0, 0, 0]
    assert tok("é", add_special_tokens=False)["input_ids"] == [tok.unk_token_id]


def test_reload_from_a_model_directory_keeps_newlines(tmp_path, tokenizer):
    """AutoTokenizer alone would pick Qwen2Tokenizer from config.json and drop newlines."""
    from race.policy.ladder import build_ladder_model

    model = build_ladder_model("nano", tokenizer)
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    again = load_tokenizer(tmp_path)
    assert again("1\n2", add_special_tokens=False)["input_ids"] == tokenizer(
        "1\n2", add_special_tokens=False)["input_ids"]
    assert len(again("1\n2", add_special_tokens=False)["input_ids"]) == 3
