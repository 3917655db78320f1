"""A WordPiece tokenizer trained on a party's own texts, so that no model or vocabulary is downloaded.

Every KNOT teacher here is a BERT-tiny-sized encoder + classifier (KNOT app. H: BERT-Tiny); the papers start from
bert-base-uncased's WordPiece vocabulary. Here each party trains its own WordPiece vocabulary on its
private training texts with the ``tokenizers`` library — BERT's normaliser (lower-casing and accent
stripping by default) and pre-tokeniser (split on whitespace and punctuation), special tokens
``[PAD] [UNK] [CLS] [SEP] [MASK]`` (ids 0–4) and BERT's post-processor (``[CLS] A [SEP]`` and
``[CLS] A [SEP] B [SEP]``) — and wraps it in a ``transformers`` fast tokenizer, so ``save_pretrained`` /
``from_pretrained`` / ``AutoTokenizer`` work offline.

**Determinism.** ``tokenizers``' own ``WordPieceTrainer`` is not deterministic across processes
(huggingface/tokenizers#1794): it numbers the ``##`` continuation tokens in hash-map order, and those
numbers break ties between equally frequent merges, so two runs on the same texts can give different
ids and even different vocabularies. :func:`train_wordpiece` therefore runs the same merge algorithm
(WordPiece training in ``tokenizers`` *is* BPE with a ``##`` continuation prefix) through the plain
``BpeTrainer`` — whose alphabet is sorted and whose ties are broken by those ids — on words whose
non-initial characters are replaced by private-use "continuation" characters, then maps the learned
pieces back (a piece starting with a continuation character becomes ``##piece``). The same texts give
the same vocabulary, in the same id order, in every process.
"""
from __future__ import annotations

from collections import Counter
from typing import Iterable, Iterator

from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers, processors, trainers
from tokenizers.models import BPE, WordPiece
from transformers import PreTrainedTokenizerFast

#: BERT's special tokens, in id order 0..4.
SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
CONTINUATION_PREFIX = "##"

# Continuation markers come from the supplementary private-use planes 15 and 16.
_MARKER_RANGES = ((0xF0000, 0xFFFFE), (0x100000, 0x10FFFE))


def _bert_backend(vocab: dict[str, int], lowercase: bool) -> Tokenizer:
    """A BERT-style WordPiece ``tokenizers.Tokenizer`` over ``vocab`` (which holds SPECIAL_TOKENS)."""
    tok = Tokenizer(WordPiece(vocab, unk_token="[UNK]", continuing_subword_prefix=CONTINUATION_PREFIX))
    tok.normalizer = _bert_normalizer(lowercase)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix=CONTINUATION_PREFIX)
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS]:0 $A:0 [SEP]:0",
        pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])],
    )
    return tok


def _bert_normalizer(lowercase: bool) -> normalizers.Normalizer:
    # strip_accents=None follows `lowercase`, as in BERT (uncased models strip accents, cased keep them)
    return normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=None,
                                      lowercase=lowercase)


def _marker_code_points(exclude: set[str]) -> Iterator[str]:
    for lo, hi in _MARKER_RANGES:
        for cp in range(lo, hi + 1):
            ch = chr(cp)
            if ch not in exclude:
                yield ch


def train_wordpiece(
    texts: Iterable[str], vocab_size: int = 8000, min_frequency: int = 2, lowercase: bool = True
) -> PreTrainedTokenizerFast:
    """A WordPiece tokenizer trained on ``texts`` (a party's own training texts), BERT-style (module doc).

    ``vocab_size`` caps the vocabulary (special tokens and the character alphabet included; a tiny corpus
    gives fewer entries); ``min_frequency`` is the least count of a merged pair. Returns a
    ``PreTrainedTokenizerFast`` whose calls add ``[CLS] … [SEP]``, pad with ``[PAD]`` (id 0), and which
    round-trips through ``save_pretrained`` / ``from_pretrained``. Deterministic: the same texts give
    the same vocabulary and ids in any process. Implements the tokenizer of the teachers
    (BERT-tiny-sized encoder + classifier) without downloading bert-base-uncased's vocabulary.
    """
    if vocab_size < len(SPECIAL_TOKENS) + 1:
        raise ValueError(f"vocab_size must be > {len(SPECIAL_TOKENS)}, got {vocab_size}")
    if min_frequency < 1:
        raise ValueError(f"min_frequency must be ≥ 1, got {min_frequency}")
    normalizer = _bert_normalizer(lowercase)
    splitter = pre_tokenizers.BertPreTokenizer()
    word_counts: Counter[str] = Counter()
    n_texts = 0
    for text in texts:
        n_texts += 1
        word_counts.update(w for w, _ in splitter.pre_tokenize_str(normalizer.normalize_str(text)))
    if not word_counts:
        raise ValueError(f"no words to train a WordPiece vocabulary on ({n_texts} texts)")

    # Every character gets a private-use continuation marker (allocated in sorted order, never a
    # character of the corpus); like WordPieceTrainer, the alphabet holds both "c" and "##c" for every
    # character seen, so unseen words still split into known pieces.
    seen = sorted({ch for word in word_counts for ch in word})
    markers = _marker_code_points(set(seen))
    to_marker = {ch: next(markers) for ch in seen}
    from_marker = {m: ch for ch, m in to_marker.items()}

    def marked(word: str) -> str:
        return word[0] + "".join(to_marker[ch] for ch in word[1:])

    # Words in sorted order, each repeated by its count: the input fully determines the trainer's counts.
    def corpus() -> Iterator[str]:
        for word in sorted(word_counts):
            yield " ".join([marked(word)] * word_counts[word])

    learner = Tokenizer(BPE(unk_token="[UNK]"))
    learner.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    learner.train_from_iterator(
        corpus(),
        trainer=trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                    special_tokens=list(SPECIAL_TOKENS), show_progress=False,
                                    initial_alphabet=seen + [to_marker[ch] for ch in seen]),
        length=len(word_counts),
    )

    vocab: dict[str, int] = {}
    for piece, idx in sorted(learner.get_vocab().items(), key=lambda kv: kv[1]):
        if piece in SPECIAL_TOKENS:
            entry = piece
        elif piece[0] in from_marker:
            entry = CONTINUATION_PREFIX + "".join(from_marker.get(ch, ch) for ch in piece)
        else:
            entry = "".join(from_marker.get(ch, ch) for ch in piece)
        vocab[entry] = idx
    if sorted(vocab.values()) != list(range(len(vocab))) or any(vocab[t] != i for i, t in enumerate(SPECIAL_TOKENS)):
        raise RuntimeError("WordPiece training produced non-contiguous ids")  # cannot happen: ids are injective
    return PreTrainedTokenizerFast(
        tokenizer_object=_bert_backend(vocab, lowercase),
        pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]",
    )


def vocabulary(tokenizer) -> list[str]:
    """Every entry of ``tokenizer``'s vocabulary (special and ``##`` pieces included) in id order — the
    token pool that KNOT appendix D.1 samples random texts from to estimate a teacher's probability bias
    (:func:`otfed.distill.random_texts`)."""
    vocab = tokenizer.get_vocab()
    return [token for token, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
