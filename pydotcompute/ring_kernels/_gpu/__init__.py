"""Internals of the GPU-resident ring kernel tier (see ``gpu_kernel.py``).

``layout`` and ``cuda_c`` import nothing heavy; ``device``, ``simlaunch`` and ``resources``
import Numba and are loaded only when a GPU actor is launched or compiled.
"""
