"""Micro-kernels: outer-product LLVM vector IR, and the registry of specialisations."""
