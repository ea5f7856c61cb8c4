"""How a user registers tasks in their own module (the snippet in t5lite/tasks/README.md).
Import it, then use the names in a config: data.mixture_or_task="my_reviews" or
"my_corpus_denoising"."""
import functools
import os

import seqio

from t5lite.tasks import metrics, registry, vocabularies

# train.tsv / dev.tsv ("text\tlabel"), corpus.txt; beside this file, so any directory works
DATA = os.environ.get("MY_DATA", os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                              "my_data"))
vocab = vocabularies.get_vocabulary("t5lite_sp8k")

seqio.TaskRegistry.add(  # text-to-text finetuning: "review: ..." -> good / bad
    "my_reviews",
    source=seqio.TextLineDataSource({"train": f"{DATA}/train.tsv",
                                     "validation": f"{DATA}/dev.tsv"}),
    preprocessors=[registry.parse_tsv, functools.partial(registry.add_prefix, prefix="review:"),
                   seqio.preprocessors.tokenize, seqio.preprocessors.append_eos_after_trim],
    output_features=registry.text_features(vocab), metric_fns=[metrics.accuracy])

registry.register_pretraining_task(  # the paper's 50% corruption, span length 10 (Tables 4-5)
    "my_corpus_denoising", "span_corruption", noise_density=0.5, mean_noise_span_length=10,
    source=seqio.TextLineDataSource({"train": f"{DATA}/corpus.txt"}))
