"""``python -m bench.observability``: see ``bench/observability/study.py``."""

from bench.observability.study import main

main()
