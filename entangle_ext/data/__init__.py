"""Dataset loaders that produce `entangle_ext.Splits` (in-memory, device-resident tensors), and the
one data-root lookup they share (`data_dirs`, `data_root`, `find_data_file`)."""
from .root import data_dirs, data_root, find_data_file, user_cache_dir
from .digits import digits_splits, DigitsMLP
from .cifar100 import cifar100_splits, load_cifar100, find_cifar100
from .tinyimagenet import tinyimagenet_splits, load_tinyimagenet, find_tinyimagenet
from .celeba import celeba_splits, read_celeba_attributes
from .toxigen import toxigen_splits, load_toxigen, load_hf_classifier, minilm_path
from .vit import vit_classifier

__all__ = ["data_dirs", "data_root", "find_data_file", "user_cache_dir", "digits_splits", "DigitsMLP",
           "cifar100_splits", "load_cifar100", "find_cifar100", "tinyimagenet_splits", "load_tinyimagenet",
           "find_tinyimagenet", "celeba_splits", "read_celeba_attributes", "toxigen_splits", "load_toxigen",
           "load_hf_classifier", "minilm_path", "vit_classifier"]
