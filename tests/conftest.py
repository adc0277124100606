"""The whole suite's one plugin. `unit/` holds the checks' logic and the pure modules, tested on subjects built in the
test (`unit/subjects.py`) or recorded from real runs: they import neither torch nor the libraries built on it, build no
model, and run in seconds. `e2e/` runs real scripts on tiny real models with pytester (its conftest
imports the heavy libraries once); `-m "not slow"` leaves out its runs of several processes and of the pretrained
MiniLM.

The in-process runs share this process's torch, which reads `THP_MEM_ALLOC_ENABLE` once, at its first CPU allocation:
before the plugin's session could set it (`pytest_trainer/huge_pages.py`). It is set here, before torch is imported,
so that the twins' wide logits cost the suite what they cost a user.
"""

import os

from pytest_trainer.huge_pages import VARIABLE

os.environ.setdefault(VARIABLE, "1")

pytest_plugins = ["pytester"]
