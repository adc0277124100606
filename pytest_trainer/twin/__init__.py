"""Twins of real checkpoints: the script's architecture, narrow and with random weights, where the real model cannot
be built on this machine (`loading`), from the checkpoint's config narrowed by `shrink`, located by `checkpoint`."""
