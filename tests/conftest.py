"""The whole suite's one plugin. `unit/` holds the checks' logic and the pure modules, tested on subjects built in the
test (`unit/subjects.py`) or recorded from real runs: they import neither torch nor the libraries built on it, build no
model, and run in seconds. `e2e/` runs real scripts on tiny real models with pytester (its conftest
imports the heavy libraries once); `-m "not slow"` leaves out its runs of several processes and of the pretrained
MiniLM.
"""

pytest_plugins = ["pytester"]
