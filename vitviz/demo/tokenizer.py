"""A small word-level tokenizer built offline, for the bundled zero-shot demo and for tests.

CLIP's text tower reads the embedding at the end-of-text token, so every sequence
ends with ``<eos>``; the config's ``eos_token_id`` must name it.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["SPECIALS", "word_tokenizer"]

SPECIALS = ("<pad>", "<unk>", "<bos>", "<eos>")


def word_tokenizer(words: Iterable[str], *, max_length: int = 16):
    """A ``PreTrainedTokenizerFast``: lower-cased words and punctuation, ``<bos> ... <eos>``, padding with ``<pad>``.

    Ids: ``<pad>`` 0, ``<unk>`` 1, ``<bos>`` 2, ``<eos>`` 3, then ``words`` in order.
    """
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIALS)}
    for w in words:
        vocab.setdefault(w.lower(), len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Whitespace(), pre_tokenizers.Punctuation()])
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A <eos>", special_tokens=[("<bos>", 2), ("<eos>", 3)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        unk_token="<unk>",
        model_max_length=max_length,
    )
