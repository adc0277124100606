"""Which devices can run here, and how to tell that a CUDA error has broken the CUDA context."""

from __future__ import annotations

#: Devices in run order: every CPU item runs before any CUDA item, so a CUDA crash cannot hide a CPU result.
DEVICES: tuple[str, ...] = ("cpu", "cuda")
#: Settings that ask for a GPU's number formats: transformers rejects bf16 and tf32 without one (TRL's configs
#: default to bf16=True), and accelerate silently drops fp16 on a CPU.
GPU_PRECISION = ("bf16", "fp16", "bf16_full_eval", "fp16_full_eval", "tf32")


def unavailable_reason(device: str) -> str | None:
    """Why `device` cannot run on this machine, or None when it can."""
    if device != "cuda":
        return None
    import torch

    if torch.cuda.is_available():
        return None
    built = f"built with CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
    return f"CUDA is not available on this machine (torch {torch.__version__}, {built})"


def context_is_broken(error: BaseException) -> bool:
    """A device-side assert (or a similar CUDA fault) leaves the context unusable for the rest of the process."""
    text = str(error)
    return "device-side assert" in text or "CUDA error" in text or type(error).__name__ == "AcceleratorError"
