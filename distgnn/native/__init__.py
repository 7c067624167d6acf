"""The compiled kernels: the C++ CPU extension (:mod:`distgnn.native.cpu`, built at install) and the CUDA
extensions (:mod:`distgnn.native.cuda`, built on first use). Ops dispatch to them from their own modules.
May import: errors.
"""
