"""Compiling for a TPU slice on any host (libtpu, no TPU needed). One concern per module,
imports downward: hlo_cost <- step_time, memory <- compile <- isolated <- search; report formats
results. The chip table, meshes and mesh advice are one layer lower, in t5lite.mesh (train and
monitor read them too).

Public entry points:
- `mesh.topology.parse_topology(name) -> Topology`, `mesh.topology.abstract_devices(topo)`,
  `mesh.topology.require_libtpu()`; `mesh.topology.CHIPS` / `peak_flops(device_kind)`: the one
  chip table (HBM, bandwidths, peak FLOP/s; the training logs' MFU reads it too);
- `compile.compile_step(cfg, topo, devices=None, hbm_bytes=0) -> dict`: compile cfg's train
  step for the slice, in process (cached per config and topology) -> the report
  (`t5lite compile --json` prints the same dict; CONTRACTS.md lists its keys);
  `compile.compile_decode(...)` the same for the decoding program;
  `compile.trace_train_step(cfg, mesh, model, tx)` the traced step on any devices;
- `search.search(cfg, topo, hbm_bytes=0)`: meshes x remat x collective matmuls x
  micro-batches, fastest fit first, each compiled in a child process
  (`isolated.CompilerProcess`: a compiler crash costs one variant, not the search);
- `report.format_report(r)` / `report.format_decode_report(r)`: the text `t5lite compile`
  prints;
- `hlo_cost.hlo_costs(hlo_text, chip)`, `hlo_cost.roofline_seconds(hlo, chip)`: costs of a
  compiled HLO module and the roofline bound; `step_time.expected_step(hlo_text, chip, shape,
  coords)`: the expected step (the schedule replayed on the slice's torus);
  `memory.memory_bytes(mem)` / `memory.analytic_bytes(...)`: per-chip memory of a compiled
  program and an analytic estimate of its live set from the shapes;
- `mesh.advice.mesh_advice(mesh, params_per_chip, opt_per_chip, hbm_bytes=0)`: the one line
  `t5lite compile` and `t5lite train` print when a mesh copies multi-GB training state on
  every chip of the data axis; `mesh.partitioning.compiler_options(cfg, mesh)`: XLA options of
  a program compiled for TPU (`mesh.xla_flags`: the asynchronous-collective ones per
  generation).
"""
