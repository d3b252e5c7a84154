"""gpuckpt: transparent checkpoint/restore of GPU containers.

The top-level folders of the repository are the subpackages of this package.
"""

__version__ = "0.1.0"
