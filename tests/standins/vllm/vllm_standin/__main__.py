"""``python3 -m vllm_standin serve MODEL ...`` behaves like the ``vllm`` script."""

import sys

from .cli import main

sys.exit(main(sys.argv[1:]))
