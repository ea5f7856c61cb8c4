"""Compiling for a TPU slice on any host: topology and chip facts, AOT compile, HLO cost, mesh search, reports."""
