"""``python -m bench.routing``: see ``bench/routing/study.py``."""

from bench.routing.study import main

main()
