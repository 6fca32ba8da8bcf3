"""Entry point in the ``torch.backends`` group: torch calls it at the end of ``import torch``.

After ``pip install fsdist``, ``init_process_group("fsdist", init_method="fsdist://...")`` works
without ``import fsdist``. An exception here would make ``import torch`` itself fail, so every
error is swallowed (and logged): the worst case is that the user must ``import fsdist``.
"""

from __future__ import annotations

import logging


def hook() -> None:
    try:
        from .registration import register

        register()
    except Exception:
        logging.getLogger(__name__).debug("fsdist autoload failed", exc_info=True)
