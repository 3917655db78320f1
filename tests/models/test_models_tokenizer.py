"""WordPiece tokenizer trained on a party's own texts (KNOT §6 teachers; KNOT app. D.1 vocabulary)."""
from __future__ import annotations

import random

from transformers import AutoTokenizer, PreTrainedTokenizerFast

from otfed.models import train_wordpiece, vocabulary
from otfed.models.tokenizer import SPECIAL_TOKENS

CORPUS = ["The good movie was good.", "A bad film, really bad!", "good acting, bad plot",
          "the plot was good", "Bad, bad, bad.", "really good film"] * 3


def _random_corpus(seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(400)] + ["good", "bad", "movie", "café"]
    return [" ".join(rng.choice(words) + rng.choice(["", "ing", "ed", "s", "!"]) for _ in range(12))
            for _ in range(300)]


def test_special_tokens_first_and_frequent_words_whole():
    tok = train_wordpiece(CORPUS, vocab_size=200)
    vocab = vocabulary(tok)
    assert tuple(vocab[:5]) == SPECIAL_TOKENS
    # Every word seen at least min_frequency (2) times has all its adjacent pairs that frequent, so BPE-style
    # merging ends with the whole word as one piece when the vocabulary is large enough.
    for word in ["good", "bad", "movie", "film", "really", "plot", "the"]:
        assert word in vocab
        assert tok.tokenize(word) == [word]
    assert tok.tokenize("GOOD Movie") == ["good", "movie"]  # lower-cased


def test_unseen_word_splits_into_known_pieces():
    tok = train_wordpiece(CORPUS, vocab_size=200)
    pieces = tok.tokenize("goodbad")
    assert pieces[0] == "good" and all(p.startswith("##") for p in pieces[1:])
    assert "".join(p.removeprefix("##") for p in pieces) == "goodbad"
    assert tok.tokenize("xyz") == ["[UNK]"]  # characters never seen


def test_cls_and_sep_added_and_pair_template():
    tok = train_wordpiece(CORPUS, vocab_size=200)
    ids = tok("good film")["input_ids"]
    assert tok.convert_ids_to_tokens(ids) == ["[CLS]", "good", "film", "[SEP]"]
    enc = tok("good film", "bad plot", return_token_type_ids=True)
    assert tok.convert_ids_to_tokens(enc["input_ids"]) == ["[CLS]", "good", "film", "[SEP]", "bad", "plot", "[SEP]"]
    assert enc["token_type_ids"] == [0, 0, 0, 0, 1, 1, 1]
    assert tok.pad_token_id == 0 and tok.unk_token_id == 1


def test_lowercase_false_keeps_case():
    tok = train_wordpiece(CORPUS, vocab_size=200, lowercase=False)
    assert "The" in vocabulary(tok) and "Bad" in vocabulary(tok)
    assert tok.tokenize("Bad") == ["Bad"]


def test_vocab_size_caps_and_vocabulary_is_in_id_order():
    tok = train_wordpiece(_random_corpus(), vocab_size=150)
    vocab = vocabulary(tok)
    assert len(vocab) == len(tok) == 150
    assert vocab == tok.convert_ids_to_tokens(list(range(len(vocab))))


def test_save_load_round_trip(tmp_path):
    tok = train_wordpiece(_random_corpus(), vocab_size=300)
    tok.save_pretrained(tmp_path)
    probe = ["w1ing w2 café good!", "unknown words zzz", "w399s movie"]
    for loaded in (PreTrainedTokenizerFast.from_pretrained(tmp_path), AutoTokenizer.from_pretrained(tmp_path)):
        assert loaded(probe)["input_ids"] == tok(probe)["input_ids"]
        assert vocabulary(loaded) == vocabulary(tok)


def test_deterministic_between_runs_and_text_orders():
    # tokenizers' own WordPieceTrainer numbers "##" pieces in hash-map order (huggingface/tokenizers#1794),
    # which changes from one training to the next even within a process; the vocabulary here must not.
    corpus = _random_corpus()
    here = vocabulary(train_wordpiece(corpus, vocab_size=300))
    for _ in range(4):
        assert vocabulary(train_wordpiece(corpus, vocab_size=300)) == here
    assert vocabulary(train_wordpiece(corpus[::-1], vocab_size=300)) == here
