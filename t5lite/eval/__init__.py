"""Using a trained model: decoding with a KV cache, seqio evaluation, inference, few-shot
prompting."""
