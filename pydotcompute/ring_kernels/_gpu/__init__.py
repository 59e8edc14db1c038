"""The GPU tier's internals (an alias path).

They live in `pydotcompute.ring_kernels.tiers.gpu`; each module here
(``_gpu.layout``, ``_gpu.resources``, ...) is that package's module itself, under its old
name, so that imports and attribute patches through the old path reach the same object.
"""
