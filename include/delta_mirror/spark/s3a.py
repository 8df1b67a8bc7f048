"""The old name of ``delta_mirror.s3a`` (moved to the bottom tier, which ``jobs/`` may import):
the same module object, so imports and monkeypatches through either name see one module."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from delta_mirror import s3a as _moved

if TYPE_CHECKING:  # what the type checker sees under the old name
    from delta_mirror.s3a import *  # noqa: F403

sys.modules[__name__] = _moved
__all__ = _moved.__all__
