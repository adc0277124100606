"""The whole suite's one plugin. `unit/` holds tests of pure logic on recorded data: they import neither torch nor the
libraries built on it, and run in seconds. `e2e/` runs real scripts on tiny real models with pytester (its conftest
imports the heavy libraries once); `-m "not slow"` leaves out its runs of several processes and of the pretrained
MiniLM.
"""

pytest_plugins = ["pytester"]
