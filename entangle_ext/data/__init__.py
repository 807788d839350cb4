"""Dataset loaders that produce `entangle_ext.Splits` (in-memory, device-resident tensors)."""
from .digits import digits_splits, DigitsMLP
from .cifar100 import cifar100_splits, load_cifar100, find_cifar100

__all__ = ["digits_splits", "DigitsMLP", "cifar100_splits", "load_cifar100", "find_cifar100"]
