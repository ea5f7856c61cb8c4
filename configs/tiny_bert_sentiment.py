"""BERT tiny, sentence classification ([CLS] -> 2 classes) on the local sentiment data
(Rotten Tomatoes sentences), BERT WordPiece vocabulary, task sentiment_cls_bert.

    t5lite train --config configs/tiny_bert_sentiment.py --workdir runs/bert_sentiment

From scratch this learns a bag-of-words-like classifier that overfits before the last step;
bench/finetune_e2e.sh also runs it after configs/tiny_bert_mlm.py pretraining (what both
reach: bench/RESULTS.md, "Finetuning the tiny configs").
To finetune a pretrained BERT instead, e.g. with LoRA on query/value and a fresh head:
    --set checkpoint.init_from=runs/bert_mlm_bert --set model.peft.lora_rank=8
(runs/bert_mlm_bert: configs/tiny_bert_mlm.py with data.mixture_or_task=corpus_mlm_bert and
model.vocab_size=30592). Other PEFT options: model.peft.{adapter_dim, ia3, prompt_tokens,
prefix_tokens, freeze, unfreeze_every}; see t5lite/peft/.
"""

from t5lite.config import cpu_recipe


def get_config():
    cfg = cpu_recipe("bert_tiny", "tiny_bert_sentiment", steps=600, every=200, log_every=20)
    cfg.model.vocab_size = 30592  # BERT uncased WordPiece (30,522) padded to a multiple of 128
    cfg.model.num_classes = 2
    cfg.data.mixture_or_task = "sentiment_cls_bert"
    cfg.data.feature_lengths = {"inputs": 64}
    cfg.data.pack = False  # one example (and one class label) per row
    cfg.optim.schedule, cfg.optim.learning_rate = "linear", 5e-4
    cfg.train.eval_steps = 12  # ~ the whole validation split (415 sentences)
    cfg.train.prepare_data = ("sentiment", "vocab_bert")
    cfg.checkpoint.keep = 1
    return cfg
