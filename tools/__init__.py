"""triton-forge: PyTorch models to a Triton model repository, checked and proven under load."""

__version__ = "0.1.0"
