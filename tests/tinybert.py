"""A 2-layer BERT in the pretrained format of all-MiniLM-L6-v2 (config.json, model.safetensors, tokenizer.json),
saved by the tests so that the text path runs without the real model."""

from pathlib import Path

import pytest
import torch

WORDS = ["stock", "oil", "price", "market", "bank", "rate", "trade", "grain", "wheat", "ship", "profit", "loss",
         "##s", "the", "of", "and", "a", "to", "in", "said"]


def save_tiny_bert(folder: Path) -> Path:
    """``folder`` holding a seeded 2-layer, 32-wide BERT and its WordPiece tokenizer, saved as transformers saves."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import BertConfig, BertModel

    vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS])}
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]",
                                                       special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    config = BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=64, pad_token_id=0,
                        initializer_range=0.3)  # large enough that attention mixes the tokens into [CLS]
    torch.manual_seed(0)
    BertModel(config).save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_bert_dir(tmp_path_factory):
    """The saved tiny BERT's folder (once per test session)."""
    pytest.importorskip("transformers")
    return save_tiny_bert(tmp_path_factory.mktemp("tiny-bert"))


@pytest.fixture
def tiny_bert(tiny_bert_dir, monkeypatch):
    """The tiny BERT as the text backbone: HETFL_MINILM_DIR points at it, as a user would point at MiniLM."""
    monkeypatch.setenv("HETFL_MINILM_DIR", str(tiny_bert_dir))
    return tiny_bert_dir
