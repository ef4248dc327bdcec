"""posembed's exception classes.

Each derives from the built-in classes that code written for PyTorch and NumPy already catches,
as ``numpy.AxisError`` derives from both ``ValueError`` and ``IndexError``:

- ``InvalidInputError(PosembedError, ValueError, RuntimeError)``: a bad argument (a shape, a
  dtype, a device, a configuration value). ``ValueError`` for NumPy-style code, ``RuntimeError``
  because that is what ``nn.Embedding`` raises for float ids or a tensor on the wrong device.
- ``IdOutOfRangeError(PosembedError, IndexError)``: a token or position id outside its table, as
  ``nn.Embedding``'s ``IndexError``, with the id, where it is, the limit and the fixes.

Nothing is written when one is raised: outputs, gradients, tables and the dropout step keep
what they held. Importing this module needs neither torch nor the compiled extension.
"""

__all__ = ["PosembedError", "InvalidInputError", "IdOutOfRangeError"]


class PosembedError(Exception):
    """Base class of every error posembed raises for a bad input."""


class InvalidInputError(PosembedError, ValueError, RuntimeError):
    """A bad argument: its message names the value, the limit and what to do."""


class IdOutOfRangeError(PosembedError, IndexError):
    """A token or position id outside its table."""
