"""The devices a program runs on and how arrays lie across them: below models' users (eval,
train, tpu, monitor), above config.

topology (the one chip table: HBM, bandwidths, peak FLOP/s; TPU slices and their abstract
devices), partitioning (the mesh from cfg.mesh, the one table of logical-axis rules, shardings
of state and batches, XLA options of a program jitted over a mesh), advice (whether a mesh
copies multi-GB training state on every chip of the data axis; no jax at import), xla_flags
(the asynchronous-collective XLA options per TPU generation; standard library only: the TPU
launcher reads it too).
"""
