"""``python -m kubesim``: serve the emulated cluster (and optionally the kubelet stand-in) until Ctrl-C."""

from __future__ import annotations

import sys

from kubesim.emulator import main

if __name__ == "__main__":
    main(sys.argv[1:])
