"""``python -m bench.multinode``: see ``bench/multinode/study.py``."""

from bench.multinode.study import main

main()
