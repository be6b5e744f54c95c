"""What the runner calls: a kernel under test as a ``Kernel``, and how it
declines an op (``Unsupported``) or fails a case (``KernelError``).  The
adapters (``adapters.py``) and the exec protocol (``execproto.py``) are
kernels of this kind.
"""

from __future__ import annotations

import numpy as np

from ...errors import InputError
from ..base.case import as_outputs
from ..table import OPS


class Unsupported(Exception):
    """The kernel does not implement this op."""


class KernelError(Exception):
    """The kernel failed on a case (raised, crashed, or returned garbage)."""


class Kernel:
    name = "kernel"

    def call(self, op_name: str, inputs: list[np.ndarray], out_specs: dict):
        raise NotImplementedError

    def call_case(self, op_name: str, inputs: list[np.ndarray], out_specs: dict, case_id: str):
        """``call`` for a kernel that is told the case id (an external program logs it)."""
        return self.call(op_name, inputs, out_specs)

    def run(
        self, op_name: str, inputs: list[np.ndarray], out_specs: dict, case_id: str = "case"
    ) -> dict[str, np.ndarray]:
        """Outputs of one case.  ``out_specs``: output name -> (dtype, shape)
        the case expects (an external program is told them)."""
        try:
            with np.errstate(all="ignore"):
                result = self.call_case(op_name, [a.copy() for a in inputs], out_specs, case_id)
        except (NotImplementedError, Unsupported) as exc:
            raise Unsupported(str(exc) or f"{self.name} does not implement {op_name}") from None
        except (KernelError, InputError):
            raise
        except Exception as exc:
            raise KernelError(f"{type(exc).__name__}: {exc}") from None
        try:
            return as_outputs(result, OPS[op_name].outputs)
        except (ValueError, TypeError) as exc:
            raise KernelError(f"bad return value: {exc}") from None
