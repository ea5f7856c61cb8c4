"""BERT tiny, masked-language-model pretraining on the local corpus (8k vocabulary).

    t5lite train --config configs/tiny_bert_mlm.py --workdir runs/bert_mlm
Add NSP with --set model.nsp_head=True and a task that emits nsp_labels.
"""

from t5lite.config import cpu_recipe


def get_config():
    cfg = cpu_recipe("bert_tiny", "tiny_bert_mlm", steps=400, every=100)
    cfg.data.mixture_or_task = "corpus_mlm"
    cfg.data.feature_lengths = {"inputs": 128}
    cfg.data.pack = False  # examples carry per-example nsp_labels; BERT pairs fill a row anyway
    cfg.optim.schedule, cfg.optim.learning_rate = "linear", 1e-3
    cfg.train.eval_steps = 4
    cfg.train.prepare_data = ("corpus", "vocab_sp8k")
    return cfg
