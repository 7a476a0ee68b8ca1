"""`roformer pretrain` as a script, for launchers that want a file.

accelerate launch scripts/tools/pretrain.py --config configs/pretrain/roformer-tiny.yaml
"""

import sys

from roformer.cli import main

if __name__ == "__main__":
    sys.exit(main(["pretrain", *sys.argv[1:]]))
